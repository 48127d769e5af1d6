-- Operating the engine: run status, fault bookkeeping, operations and telemetry (DESIGN §4, §6).

-- active | paused | sleeping (until sleep_until) | fault (backing off until sleep_until) |
-- failed (parked for an operator) | killed (terminal).
ALTER TABLE entities ADD COLUMN run_status TEXT NOT NULL DEFAULT 'active';
ALTER TABLE entities ADD COLUMN sleep_until INTEGER;
-- Times (ms) of the entity's recent errors, as the fault policy keeps them (JSON array).
ALTER TABLE entities ADD COLUMN recent_errors TEXT NOT NULL DEFAULT '[]';
-- 1 while the entity is in an unstable state (a workflow runs): operations wait for it.
ALTER TABLE entities ADD COLUMN busy INTEGER NOT NULL DEFAULT 0;
-- The telemetry event whose workflow the entity is in.
ALTER TABLE entities ADD COLUMN event_id INTEGER;
-- The definition version the entity's latest transition ran under.
ALTER TABLE entities ADD COLUMN machine_hash TEXT;
-- Transitions so far in the current event's workflow (the next one's ordinal - 1).
ALTER TABLE entities ADD COLUMN ordinal INTEGER NOT NULL DEFAULT 0;
-- 1 once the entity is some entity's successor: its state changes notify predecessors.
ALTER TABLE entities ADD COLUMN has_predecessors INTEGER NOT NULL DEFAULT 0;
CREATE INDEX entities_busy_request ON entities (request_id) WHERE busy = 1;
CREATE INDEX entities_run_status ON entities (run_status) WHERE run_status <> 'active';
CREATE INDEX inbox_request ON inbox (request_id);
ALTER TABLE history ADD COLUMN machine_hash TEXT;

CREATE TABLE operations (
    id                INTEGER PRIMARY KEY,
    request_id        TEXT    NOT NULL UNIQUE,
    name              TEXT    NOT NULL,
    machine           TEXT,
    entity_key        TEXT,
    started_at        INTEGER NOT NULL,
    ended_at          INTEGER,
    first_response_at INTEGER,
    last_progress_at  INTEGER NOT NULL,
    outcome           TEXT,     -- success | failed | canceled | hung
    error             TEXT,
    restart_count     INTEGER NOT NULL DEFAULT 0,
    dimensions        TEXT    NOT NULL DEFAULT '{}',
    error_seen        INTEGER NOT NULL DEFAULT 0,
    canceled          INTEGER NOT NULL DEFAULT 0
);
-- Telemetry tables carry no secondary index the engine's hot path does not need: every
-- index is one more b-tree written by every commit. Reports scan.
CREATE INDEX operations_open ON operations (started_at) WHERE ended_at IS NULL;

CREATE TABLE events (
    id            INTEGER PRIMARY KEY,  -- the inbox id of the event
    operation_id  INTEGER REFERENCES operations (id),
    request_id    TEXT,
    seq           INTEGER NOT NULL,   -- the inbox id: the order events were raised in
    entity_id     INTEGER NOT NULL REFERENCES entities (id),
    machine       TEXT    NOT NULL,
    entity_key    TEXT    NOT NULL,
    event         TEXT    NOT NULL,
    kind          TEXT    NOT NULL,   -- raised | nested | subscription | timer
    start_state   TEXT    NOT NULL,
    end_state     TEXT,
    start_time    INTEGER NOT NULL,   -- when the event was raised
    end_time      INTEGER,            -- when the entity was at rest again
    rejected      INTEGER NOT NULL DEFAULT 0,
    failed        INTEGER NOT NULL DEFAULT 0,
    error_id      INTEGER,
    exception     TEXT
);

CREATE TABLE transitions (
    id                INTEGER PRIMARY KEY,
    operation_id      INTEGER REFERENCES operations (id),
    request_id        TEXT,
    event_id          INTEGER REFERENCES events (id),
    history_id        INTEGER NOT NULL REFERENCES history (id),
    ordinal           INTEGER NOT NULL,   -- position within its event's workflow
    entity_id         INTEGER NOT NULL,
    machine           TEXT    NOT NULL,
    kind              TEXT    NOT NULL,   -- create | event | event_action | auto_action
    action            TEXT,
    start_state       TEXT,
    end_state         TEXT    NOT NULL,
    start_health      TEXT,
    end_health        TEXT    NOT NULL,
    entry_time        INTEGER NOT NULL,   -- when the start state was entered
    start_time        INTEGER NOT NULL,   -- event received, or action started
    retry_count       INTEGER NOT NULL,
    action_start_time INTEGER,
    end_time          INTEGER NOT NULL,
    outcome           TEXT    NOT NULL,   -- ok | retry | error
    error             TEXT,
    machine_hash      TEXT
);

CREATE TABLE errors (
    id           INTEGER PRIMARY KEY,
    entity_id    INTEGER,
    operation_id INTEGER,
    request_id   TEXT,
    at           INTEGER NOT NULL,
    kind         TEXT    NOT NULL,   -- action_error | panic | refused | commit_failed
    details      TEXT    NOT NULL
);
CREATE INDEX errors_at ON errors (at);

CREATE TABLE exceptions (
    id        INTEGER PRIMARY KEY,
    error_id  INTEGER REFERENCES errors (id),
    at        INTEGER NOT NULL,
    details   TEXT    NOT NULL
);

-- State changes are the hottest write; listing by state is a report: it scans (entities of
-- one machine are found through the unique (machine, key) index).
DROP INDEX entities_machine_state;
