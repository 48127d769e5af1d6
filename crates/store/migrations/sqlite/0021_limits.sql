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
-- A hold is the entity's own (task_id 0), or, once the entity left the state while an
-- agent's task of it was leased, that task's until its lock runs out or its agent answers:
-- the call is still in flight.
CREATE TABLE limit_holds (
    entity_id INTEGER NOT NULL,
    name      TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    since     INTEGER NOT NULL,
    task_id   INTEGER NOT NULL DEFAULT 0,
    until     INTEGER,
    PRIMARY KEY (entity_id, name, task_id)
);
CREATE INDEX limit_holds_task ON limit_holds (task_id) WHERE task_id <> 0;
CREATE INDEX limit_holds_slot ON limit_holds (name, key) WHERE task_id <> 0;
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
