-- Workflows across entities: successor edges, timers, inbox item kinds, fired subscriptions.
CREATE TABLE successors (
    predecessor_id BIGINT NOT NULL REFERENCES entities (id),
    successor_id   BIGINT NOT NULL REFERENCES entities (id),
    request_id     TEXT,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (predecessor_id, successor_id)
);
CREATE INDEX successors_successor ON successors (successor_id);

-- Timers are rows with a due time, never sleeping tasks.
CREATE TABLE timers (
    entity_id  BIGINT  NOT NULL REFERENCES entities (id),
    name       TEXT    NOT NULL,
    event      TEXT    NOT NULL,
    due_at     BIGINT  NOT NULL,
    every_ms   BIGINT,
    PRIMARY KEY (entity_id, name)
);
CREATE INDEX timers_due ON timers (due_at);

-- raised (by a caller), nested (by another entity's action), timer, subscription, notice
-- (a successor changed state: the subscriptions of the entity are to be evaluated).
ALTER TABLE inbox ADD COLUMN kind TEXT NOT NULL DEFAULT 'raised';
-- Subscription events fired during the current state entry (JSON array), and the earliest
-- timer due time (part of due_at).
ALTER TABLE entities ADD COLUMN fired TEXT NOT NULL DEFAULT '[]';
ALTER TABLE entities ADD COLUMN timer_at BIGINT;
