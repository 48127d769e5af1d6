-- Rates and fairness of limits (DESIGN §10). A slot row may have no `max` (a limit of rate
-- only) and keeps its rate: `spacing_us` between two starts, `next_us` the earliest time
-- the next may start. `round` is the turn of the fairness value admitted last; `waiting`
-- and `task_holds` count its line and the slots canceled tasks keep (none: nothing to
-- look up).
CREATE TABLE limit_slots_next (
    name       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    in_use     INTEGER NOT NULL,
    max        INTEGER,
    spacing_us INTEGER,
    next_us    INTEGER NOT NULL DEFAULT 0,
    round      INTEGER NOT NULL DEFAULT 0,
    waiting    INTEGER NOT NULL DEFAULT 0,
    task_holds INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (name, key)
);
INSERT INTO limit_slots_next (name, key, in_use, max, waiting, task_holds)
    SELECT s.name, s.key, s.in_use, s.max,
        (SELECT COUNT(*) FROM limit_waiters w WHERE w.name = s.name AND w.key = s.key),
        (SELECT COUNT(*) FROM limit_holds h WHERE h.name = s.name AND h.key = s.key AND h.task_id <> 0)
    FROM limit_slots s;
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
