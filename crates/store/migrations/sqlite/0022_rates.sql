-- Rates and fairness of limits (DESIGN §10). A slot row may have no `max` (a limit of rate
-- only) and keeps its rate: `spacing_us` between two starts, `next_us` the earliest time
-- the next may start. `round` is the turn of the fairness value admitted last.
CREATE TABLE limit_slots_next (
    name       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    in_use     INTEGER NOT NULL,
    max        INTEGER,
    spacing_us INTEGER,
    next_us    INTEGER NOT NULL DEFAULT 0,
    round      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (name, key)
);
INSERT INTO limit_slots_next (name, key, in_use, max) SELECT name, key, in_use, max FROM limit_slots;
DROP TABLE limit_slots;
ALTER TABLE limit_slots_next RENAME TO limit_slots;
-- A line is admitted round-robin across its fairness values (`fair`: the value of the
-- limit's `fair_by`, '' without one), each value's waiters by priority, then arrival.
ALTER TABLE limit_waiters ADD COLUMN fair TEXT NOT NULL DEFAULT '';
DROP INDEX limit_waiters_order;
CREATE INDEX limit_waiters_order ON limit_waiters (name, key, fair, priority DESC, seq);
-- Each fairness value with work waiting, and its turn: the value with the lowest turn is
-- admitted next, and its turn moves one round on.
CREATE TABLE limit_fair (
    name    TEXT    NOT NULL,
    key     TEXT    NOT NULL,
    fair    TEXT    NOT NULL,
    turn    INTEGER NOT NULL,
    waiting INTEGER NOT NULL,
    PRIMARY KEY (name, key, fair)
);
CREATE INDEX limit_fair_turn ON limit_fair (name, key, turn, fair) WHERE waiting > 0;
INSERT INTO limit_fair (name, key, fair, turn, waiting)
    SELECT name, key, '', 0, COUNT(*) FROM limit_waiters GROUP BY name, key;
