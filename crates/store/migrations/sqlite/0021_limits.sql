-- Flow control (DESIGN §10): the slots of each concurrency limit per key value, who holds
-- them, and who waits for them. A slot row changes in the same transaction as the start of
-- the action that takes it and the commit that ends it, so `in_use` is exact.
CREATE TABLE limit_slots (
    name   TEXT    NOT NULL,
    key    TEXT    NOT NULL,
    in_use INTEGER NOT NULL,
    max    INTEGER NOT NULL,
    PRIMARY KEY (name, key)
);
CREATE TABLE limit_holds (
    entity_id INTEGER NOT NULL,
    name      TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    since     INTEGER NOT NULL,
    PRIMARY KEY (entity_id, name)
);
-- Waiting work is admitted by priority, then in arrival order: the index is that order.
CREATE TABLE limit_waiters (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    entity_id INTEGER NOT NULL UNIQUE,
    name      TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    priority  INTEGER NOT NULL,
    since     INTEGER NOT NULL
);
CREATE INDEX limit_waiters_order ON limit_waiters (name, key, priority DESC, seq);
