-- Core tables: machine definitions, entities, inboxes, history, application metadata.
CREATE TABLE machines (
    name        TEXT    NOT NULL,
    hash        TEXT    NOT NULL,
    definition  TEXT    NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (name, hash)
);

CREATE TABLE entities (
    id          INTEGER PRIMARY KEY,
    machine     TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    properties  TEXT    NOT NULL DEFAULT '{}',
    version     INTEGER NOT NULL,
    retry       INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    entered_at  INTEGER NOT NULL,
    auto_at     INTEGER,
    due_at      INTEGER,
    lease_owner TEXT,
    lease_until INTEGER,
    request_id  TEXT,
    UNIQUE (machine, key)
);
-- The narrow index of due work: dormant entities (due_at NULL) are not in it.
CREATE INDEX entities_due ON entities (due_at) WHERE due_at IS NOT NULL;
CREATE INDEX entities_machine_state ON entities (machine, state);

CREATE TABLE inbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    entity_id   INTEGER NOT NULL REFERENCES entities (id),
    event       TEXT    NOT NULL,
    params      TEXT    NOT NULL,
    request_id  TEXT,
    created_at  INTEGER NOT NULL
);
CREATE INDEX inbox_entity ON inbox (entity_id, id);

CREATE TABLE history (
    id          INTEGER PRIMARY KEY,
    entity_id   INTEGER NOT NULL REFERENCES entities (id),
    from_state  TEXT,
    to_state    TEXT,
    kind        TEXT    NOT NULL,
    action      TEXT,
    event       TEXT,
    retry       INTEGER NOT NULL DEFAULT 0,
    request_id  TEXT,
    at          INTEGER NOT NULL,
    detail      TEXT
);
CREATE INDEX history_entity ON history (entity_id, id);

CREATE TABLE meta (
    key         TEXT PRIMARY KEY,
    value       TEXT NOT NULL
);
