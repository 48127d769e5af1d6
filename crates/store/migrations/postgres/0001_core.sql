-- Core tables: machine definitions, entities, inboxes, history, application metadata.
-- The PostgreSQL twin of migrations/sqlite/0001_core.sql: same tables, columns and
-- meaning; times are milliseconds since the epoch (BIGINT), JSON is stored as text.
CREATE TABLE machines (
    name        TEXT    NOT NULL,
    hash        TEXT    NOT NULL,
    definition  TEXT    NOT NULL,
    created_at  BIGINT  NOT NULL,
    PRIMARY KEY (name, hash)
);

CREATE TABLE entities (
    id          BIGSERIAL PRIMARY KEY,
    machine     TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    properties  TEXT    NOT NULL DEFAULT '{}',
    version     BIGINT  NOT NULL,
    retry       BIGINT  NOT NULL DEFAULT 0,
    created_at  BIGINT  NOT NULL,
    entered_at  BIGINT  NOT NULL,
    auto_at     BIGINT,
    due_at      BIGINT,
    lease_owner TEXT,
    lease_until BIGINT,
    request_id  TEXT,
    UNIQUE (machine, key)
);
-- The narrow index of due work: dormant entities (due_at NULL) are not in it.
CREATE INDEX entities_due ON entities (due_at) WHERE due_at IS NOT NULL;

CREATE TABLE inbox (
    id          BIGSERIAL PRIMARY KEY,
    entity_id   BIGINT  NOT NULL REFERENCES entities (id),
    event       TEXT    NOT NULL,
    params      TEXT    NOT NULL,
    request_id  TEXT,
    created_at  BIGINT  NOT NULL
);
CREATE INDEX inbox_entity ON inbox (entity_id, id);

CREATE TABLE history (
    id          BIGSERIAL PRIMARY KEY,
    entity_id   BIGINT  NOT NULL REFERENCES entities (id),
    from_state  TEXT,
    to_state    TEXT,
    kind        TEXT    NOT NULL,
    action      TEXT,
    event       TEXT,
    retry       BIGINT  NOT NULL DEFAULT 0,
    request_id  TEXT,
    at          BIGINT  NOT NULL,
    detail      TEXT
);
CREATE INDEX history_entity ON history (entity_id, id);

CREATE TABLE meta (
    key         TEXT PRIMARY KEY,
    value       TEXT NOT NULL
);
