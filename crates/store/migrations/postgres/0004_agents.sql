-- External agents (DESIGN §5): the tasks offered to agent queues. A task is written in the
-- commit that makes its entity wait for an agent; agents lease it, heartbeat, and report.
-- The PostgreSQL twin of migrations/sqlite/0004_agents.sql.
CREATE TABLE agent_tasks (
    id             BIGSERIAL PRIMARY KEY,
    entity_id      BIGINT NOT NULL REFERENCES entities (id),
    queue          TEXT    NOT NULL,
    action         TEXT    NOT NULL,
    state          TEXT    NOT NULL,   -- the state whose auto action it is
    entity_version BIGINT NOT NULL,   -- the state entry it belongs to (fences the report)
    retry          BIGINT NOT NULL,   -- the entity's retry count of that entry
    lock_ms        BIGINT NOT NULL,
    request_id     TEXT,
    status         TEXT    NOT NULL,   -- ready | leased | done | canceled
    -- When it may be leased: the offer's time while ready, the lock's end while leased
    -- (an expired lease makes the task available again).
    available_at   BIGINT NOT NULL,
    attempt        BIGINT NOT NULL DEFAULT 0,  -- how many times it was leased
    token          TEXT,
    agent          TEXT,
    leased_at      BIGINT,
    locked_until   BIGINT,
    created_at     BIGINT NOT NULL,
    finished_at    BIGINT,
    outcome        TEXT,               -- complete | fail | canceled
    error          TEXT
);
CREATE INDEX agent_tasks_offered ON agent_tasks (queue, available_at) WHERE status IN ('ready', 'leased');
CREATE INDEX agent_tasks_entity ON agent_tasks (entity_id) WHERE status IN ('ready', 'leased');
