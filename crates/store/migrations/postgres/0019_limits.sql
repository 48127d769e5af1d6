-- Flow control (DESIGN §10): the slots of each concurrency limit per key value, who holds
-- them, and who waits for them. A slot row changes in the same transaction as the start of
-- the action that takes it and the commit that ends it (locked by both), so `in_use` is
-- exact across instances.
CREATE TABLE limit_slots (
    name   TEXT   NOT NULL,
    key    TEXT   NOT NULL,
    in_use BIGINT NOT NULL,
    max    BIGINT NOT NULL,
    PRIMARY KEY (name, key)
);
-- A hold is the entity's own (task_id 0), or, once the entity left the state while an
-- agent's task of it was leased, that task's until its lock runs out or its agent answers:
-- the call is still in flight.
CREATE TABLE limit_holds (
    entity_id BIGINT NOT NULL,
    name      TEXT   NOT NULL,
    key       TEXT   NOT NULL,
    since     BIGINT NOT NULL,
    task_id   BIGINT NOT NULL DEFAULT 0,
    until     BIGINT,
    PRIMARY KEY (entity_id, name, task_id)
);
CREATE INDEX limit_holds_task ON limit_holds (task_id) WHERE task_id <> 0;
CREATE INDEX limit_holds_slot ON limit_holds (name, key) WHERE task_id <> 0;
-- Waiting work is admitted by priority, then in arrival order: the index is that order.
CREATE TABLE limit_waiters (
    seq       BIGSERIAL PRIMARY KEY,
    entity_id BIGINT NOT NULL UNIQUE,
    name      TEXT   NOT NULL,
    key       TEXT   NOT NULL,
    priority  BIGINT NOT NULL,
    since     BIGINT NOT NULL
);
CREATE INDEX limit_waiters_order ON limit_waiters (name, key, priority DESC, seq);
