-- Bulk operations (DESIGN §9): one command or event for every entity matching a filter, as
-- one durable operation. `cursor` is where the next page starts; `done` and `failed`
-- advance with it, page by page, by the instance holding the lease (`owner`,
-- `lease_until`). Each entity's command carries the request id `{request_id}/{entity id}`,
-- so a page run again after a crash replays what it had done.
CREATE TABLE bulk_operations (
    id          INTEGER PRIMARY KEY,
    request_id  TEXT    NOT NULL UNIQUE,
    action      TEXT    NOT NULL,   -- pause | resume | retry | release | kill | raise
    event       TEXT,
    params      TEXT,
    filter      TEXT    NOT NULL,   -- JSON: machine, state, status, prefix, health
    reason      TEXT    NOT NULL,
    rate        INTEGER NOT NULL,   -- entities a second at most
    status      TEXT    NOT NULL,   -- running | done | canceled
    total       INTEGER NOT NULL,
    cursor      TEXT,
    done        INTEGER NOT NULL,
    failed      INTEGER NOT NULL,
    last_error  TEXT,
    owner       TEXT,
    lease_until INTEGER,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    ended_at    INTEGER
);
CREATE INDEX bulk_operations_running ON bulk_operations (id) WHERE status = 'running';
