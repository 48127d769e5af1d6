-- What a waiting caller needs to know of a processed event, whichever instance processed
-- it: why it was rejected (or how its action failed), and the state its action entered.
ALTER TABLE events ADD COLUMN reason TEXT;
ALTER TABLE events ADD COLUMN entered TEXT;
