-- The change feed (DESIGN §9): every history row and every operation's end carries the id
-- of the transaction that wrote it (`xid`, `end_xid`). A reader takes, in (xid, id) order,
-- only what transactions older than the oldest one still running wrote
-- (`pg_snapshot_xmin`): nothing can commit behind a position once it was read, whichever
-- instance writes, so a client resuming from its last position misses nothing. Rows
-- written before this migration have none and are not in the feed.
ALTER TABLE history ADD COLUMN xid BIGINT;
ALTER TABLE history ALTER COLUMN xid SET DEFAULT (pg_current_xact_id()::text::bigint);
CREATE INDEX history_feed ON history (xid) WHERE xid IS NOT NULL;
ALTER TABLE operations ADD COLUMN end_xid BIGINT;
CREATE INDEX operations_feed ON operations (end_xid) WHERE end_xid IS NOT NULL;
