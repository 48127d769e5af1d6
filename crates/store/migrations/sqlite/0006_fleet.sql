-- What the dashboard's overview and filtered lists read at fleet scale (a million
-- entities) without scanning the fleet: counts kept by the commit that changes them, and
-- the indexes a filtered page is read through. Triggers keep the counts, so every path
-- that writes entities (commits, operator commands, upgrades) keeps them right by
-- construction, in its own transaction.

-- Entities per machine, state and run status. Rows that fall to 0 stay (readers skip them).
CREATE TABLE entity_counts (
    machine    TEXT    NOT NULL,
    state      TEXT    NOT NULL,
    run_status TEXT    NOT NULL,
    n          INTEGER NOT NULL,
    PRIMARY KEY (machine, state, run_status)
) WITHOUT ROWID;
INSERT INTO entity_counts (machine, state, run_status, n)
SELECT machine, state, run_status, COUNT(*) FROM entities GROUP BY machine, state, run_status;

CREATE TRIGGER entity_counts_insert AFTER INSERT ON entities BEGIN
    INSERT INTO entity_counts (machine, state, run_status, n) VALUES (NEW.machine, NEW.state, NEW.run_status, 1)
    ON CONFLICT (machine, state, run_status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER entity_counts_update AFTER UPDATE OF machine, state, run_status ON entities
WHEN OLD.machine IS NOT NEW.machine OR OLD.state IS NOT NEW.state OR OLD.run_status IS NOT NEW.run_status BEGIN
    UPDATE entity_counts SET n = n - 1
     WHERE machine = OLD.machine AND state = OLD.state AND run_status = OLD.run_status;
    INSERT INTO entity_counts (machine, state, run_status, n) VALUES (NEW.machine, NEW.state, NEW.run_status, 1)
    ON CONFLICT (machine, state, run_status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER entity_counts_delete AFTER DELETE ON entities BEGIN
    UPDATE entity_counts SET n = n - 1
     WHERE machine = OLD.machine AND state = OLD.state AND run_status = OLD.run_status;
END;

-- Operations per outcome (`open`: not ended).
CREATE TABLE operation_counts (
    outcome TEXT    NOT NULL PRIMARY KEY,
    n       INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO operation_counts (outcome, n)
SELECT COALESCE(outcome, 'open'), COUNT(*) FROM operations GROUP BY COALESCE(outcome, 'open');
CREATE TRIGGER operation_counts_insert AFTER INSERT ON operations BEGIN
    INSERT INTO operation_counts (outcome, n) VALUES (COALESCE(NEW.outcome, 'open'), 1)
    ON CONFLICT (outcome) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER operation_counts_update AFTER UPDATE OF outcome ON operations
WHEN OLD.outcome IS NOT NEW.outcome BEGIN
    UPDATE operation_counts SET n = n - 1 WHERE outcome = COALESCE(OLD.outcome, 'open');
    INSERT INTO operation_counts (outcome, n) VALUES (COALESCE(NEW.outcome, 'open'), 1)
    ON CONFLICT (outcome) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER operation_counts_delete AFTER DELETE ON operations BEGIN
    UPDATE operation_counts SET n = n - 1 WHERE outcome = COALESCE(OLD.outcome, 'open');
END;

-- Transitions (state entries) and errors per minute (`minute`: ms since the epoch / 60000).
CREATE TABLE minute_counts (
    minute      INTEGER NOT NULL PRIMARY KEY,
    transitions INTEGER NOT NULL,
    errors      INTEGER NOT NULL
);
INSERT INTO minute_counts (minute, transitions, errors)
SELECT minute, SUM(t), SUM(e) FROM (
    SELECT at / 60000 AS minute, 1 AS t, 0 AS e FROM history
     WHERE to_state IS NOT NULL AND transition_kind IS NOT NULL
    UNION ALL
    SELECT at / 60000, 0, 1 FROM errors
) GROUP BY minute;
CREATE TRIGGER minute_counts_transition AFTER INSERT ON history
WHEN NEW.to_state IS NOT NULL AND NEW.transition_kind IS NOT NULL BEGIN
    INSERT INTO minute_counts (minute, transitions, errors) VALUES (NEW.at / 60000, 1, 0)
    ON CONFLICT (minute) DO UPDATE SET transitions = transitions + 1;
END;
CREATE TRIGGER minute_counts_error AFTER INSERT ON errors BEGIN
    INSERT INTO minute_counts (minute, transitions, errors) VALUES (NEW.at / 60000, 0, 1)
    ON CONFLICT (minute) DO UPDATE SET errors = errors + 1;
END;

-- A page of one state's entities in id order (the rowid ends every SQLite index entry):
-- a state change now also moves one index entry.
CREATE INDEX entities_machine_state ON entities (machine, state);
