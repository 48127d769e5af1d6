-- Operating the engine: run status, fault bookkeeping, operations and telemetry (DESIGN §4, §6).
-- The PostgreSQL twin of migrations/sqlite/0003_operate.sql.

-- active | paused | sleeping (until sleep_until) | fault (backing off until sleep_until) |
-- failed (parked for an operator) | killed (terminal).
ALTER TABLE entities ADD COLUMN run_status TEXT NOT NULL DEFAULT 'active';
ALTER TABLE entities ADD COLUMN sleep_until BIGINT;
-- Times (ms) of the entity's recent errors, as the fault policy keeps them (JSON array).
ALTER TABLE entities ADD COLUMN recent_errors TEXT NOT NULL DEFAULT '[]';
-- 1 while the entity is in an unstable state (a workflow runs): operations wait for it.
ALTER TABLE entities ADD COLUMN busy BOOLEAN NOT NULL DEFAULT FALSE;
-- The telemetry event whose workflow the entity is in.
ALTER TABLE entities ADD COLUMN event_id BIGINT;
-- The definition version the entity's latest transition ran under.
ALTER TABLE entities ADD COLUMN machine_hash TEXT;
-- Transitions so far in the current event's workflow (the next one's ordinal - 1).
ALTER TABLE entities ADD COLUMN ordinal BIGINT NOT NULL DEFAULT 0;
-- 1 once the entity is some entity's successor: its state changes notify predecessors.
ALTER TABLE entities ADD COLUMN has_predecessors BOOLEAN NOT NULL DEFAULT FALSE;
CREATE INDEX entities_busy_request ON entities (request_id) WHERE busy;
CREATE INDEX entities_run_status ON entities (run_status) WHERE run_status <> 'active';
CREATE INDEX inbox_request ON inbox (request_id);
ALTER TABLE history ADD COLUMN machine_hash TEXT;

CREATE TABLE operations (
    id                BIGSERIAL PRIMARY KEY,
    request_id        TEXT    NOT NULL UNIQUE,
    name              TEXT    NOT NULL,
    machine           TEXT,
    entity_key        TEXT,
    started_at        BIGINT NOT NULL,
    ended_at          BIGINT,
    first_response_at BIGINT,
    outcome           TEXT,     -- success | failed | canceled | hung
    error             TEXT,
    restart_count     BIGINT NOT NULL DEFAULT 0,
    dimensions        TEXT    NOT NULL DEFAULT '{}',
    error_seen        BOOLEAN NOT NULL DEFAULT FALSE,
    canceled          BOOLEAN NOT NULL DEFAULT FALSE
);
-- Telemetry tables carry no secondary index the engine's hot path does not need: every
-- index is one more b-tree written by every commit. Reports scan.
CREATE INDEX operations_open ON operations (started_at) WHERE ended_at IS NULL;

CREATE TABLE events (
    id            BIGINT PRIMARY KEY,     -- the inbox id of the event
    operation_id  BIGINT REFERENCES operations (id),
    request_id    TEXT,
    seq           BIGINT NOT NULL,   -- the inbox id: the order events were raised in
    entity_id     BIGINT NOT NULL REFERENCES entities (id),
    machine       TEXT    NOT NULL,
    entity_key    TEXT    NOT NULL,
    event         TEXT    NOT NULL,
    kind          TEXT    NOT NULL,   -- raised | nested | subscription | timer
    start_state   TEXT    NOT NULL,
    end_state     TEXT,
    start_time    BIGINT NOT NULL,   -- when the event was raised
    end_time      BIGINT,            -- when the entity was at rest again
    rejected      BOOLEAN NOT NULL DEFAULT FALSE,
    failed        BOOLEAN NOT NULL DEFAULT FALSE,
    error_id      BIGINT,
    exception     TEXT
);

-- Transitions: every state entry is one history row, which carries the transition's
-- telemetry; `transitions` is the view of those rows at the level of DESIGN §6 (one append
-- per state entry instead of two).
ALTER TABLE history ADD COLUMN event_id BIGINT;          -- the event whose workflow it is part of
ALTER TABLE history ADD COLUMN ordinal BIGINT;           -- position in that workflow
ALTER TABLE history ADD COLUMN transition_kind TEXT;      -- create | event | event_action | auto_action
ALTER TABLE history ADD COLUMN start_health TEXT;
ALTER TABLE history ADD COLUMN end_health TEXT;
ALTER TABLE history ADD COLUMN entry_time BIGINT;        -- when the start state was entered
ALTER TABLE history ADD COLUMN start_time BIGINT;        -- event received, or action started
ALTER TABLE history ADD COLUMN action_start_time BIGINT;
ALTER TABLE history ADD COLUMN outcome TEXT;              -- ok | retry | error

CREATE VIEW transitions AS
SELECT h.id                 AS id,
       o.id                 AS operation_id,
       h.request_id         AS request_id,
       h.event_id           AS event_id,
       h.id                 AS history_id,
       h.ordinal            AS ordinal,
       h.entity_id          AS entity_id,
       e.machine            AS machine,
       h.transition_kind    AS kind,
       h.action             AS action,
       h.from_state         AS start_state,
       h.to_state           AS end_state,
       h.start_health       AS start_health,
       h.end_health         AS end_health,
       h.entry_time         AS entry_time,
       h.start_time         AS start_time,
       h.retry              AS retry_count,
       h.action_start_time  AS action_start_time,
       h.at                 AS end_time,
       h.outcome            AS outcome,
       CASE WHEN h.kind = 'fault' THEN h.detail END AS error,
       h.machine_hash       AS machine_hash
FROM history h
JOIN entities e ON e.id = h.entity_id
LEFT JOIN operations o ON o.request_id = h.request_id
WHERE h.to_state IS NOT NULL AND h.transition_kind IS NOT NULL;

CREATE TABLE errors (
    id           BIGSERIAL PRIMARY KEY,
    entity_id    BIGINT,
    operation_id BIGINT,
    request_id   TEXT,
    at           BIGINT NOT NULL,
    kind         TEXT    NOT NULL,   -- action_error | panic | refused | commit_failed
    details      TEXT    NOT NULL
);
CREATE INDEX errors_at ON errors (at);

CREATE TABLE exceptions (
    id        BIGSERIAL PRIMARY KEY,
    error_id  BIGINT REFERENCES errors (id),
    at        BIGINT NOT NULL,
    details   TEXT    NOT NULL
);

