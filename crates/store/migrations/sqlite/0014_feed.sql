-- The change feed (DESIGN §9): every history row and every operation's end carries the
-- number of the write that made it (`xid`, `end_xid`), taken from `feed_clock` by each
-- write of the file's only writer: a reader takes what is committed in (xid, id) order,
-- and a client resuming from its last position misses nothing. Rows written before this
-- migration have none and are not in the feed.
ALTER TABLE history ADD COLUMN xid INTEGER;
CREATE INDEX history_feed ON history (xid) WHERE xid IS NOT NULL;
ALTER TABLE operations ADD COLUMN end_xid INTEGER;
CREATE INDEX operations_feed ON operations (end_xid) WHERE end_xid IS NOT NULL;
CREATE TABLE feed_clock (seq INTEGER NOT NULL);
INSERT INTO feed_clock (seq) VALUES (0);
