-- Calendar schedules (DESIGN §9): one row per (machine, schedule) with its progress. The
-- next fire's instant and when it runs (with its jitter), a fire held until the previous
-- one ends (overlap buffer_one), the last fire, counts of fires fired, missed (catch-up)
-- and skipped (overlap), an operator's pause, and the lease of the instance deciding for
-- it. A fire's request id is made from its instant, so a fire repeated is a replay.
CREATE TABLE schedules (
    machine       TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    spec          TEXT    NOT NULL,   -- the declaration followed: another starts it afresh
    next_fire     BIGINT  NOT NULL,
    next_at       BIGINT  NOT NULL,
    buffered      BIGINT,
    last_fire     BIGINT,
    last_fired_at BIGINT,
    fired         BIGINT  NOT NULL,
    missed        BIGINT  NOT NULL,
    skipped       BIGINT  NOT NULL,
    paused        BOOLEAN  NOT NULL,
    owner         TEXT,
    lease_until   BIGINT,
    updated_at    BIGINT  NOT NULL,
    PRIMARY KEY (machine, name)
);
