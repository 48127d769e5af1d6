-- Sync nested events (DESIGN §1): an event raised by an action may ask for a reply when its
-- workflow ends on the entity it was raised on; the inbox row carries the request, and the
-- events row keeps it while the workflow runs (JSON text {"machine", "key", "event"}).
ALTER TABLE inbox ADD COLUMN reply TEXT;
ALTER TABLE events ADD COLUMN reply TEXT;
