-- Priorities (DESIGN §10): a request's priority, set when its operation opens; the work it
-- starts waits in a limit's line by it (higher first).
ALTER TABLE operations ADD COLUMN priority BIGINT NOT NULL DEFAULT 0;
-- A bulk operation's priority for the events it raises (null: their default, lower than a
-- request's).
ALTER TABLE bulk_operations ADD COLUMN priority BIGINT;
