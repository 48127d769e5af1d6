-- Rates and fairness of limits (DESIGN §10). A slot row may have no `max` (a limit of rate
-- only) and keeps its rate: `spacing_us` between two starts, `next_us` the earliest time
-- the next may start. `round` is the turn of the fairness value admitted last; `waiting`
-- and `task_holds` count its line and the slots canceled tasks keep (none: nothing to
-- look up).
ALTER TABLE limit_slots ALTER COLUMN max DROP NOT NULL;
ALTER TABLE limit_slots ADD COLUMN spacing_us BIGINT;
ALTER TABLE limit_slots ADD COLUMN next_us BIGINT NOT NULL DEFAULT 0;
ALTER TABLE limit_slots ADD COLUMN round BIGINT NOT NULL DEFAULT 0;
ALTER TABLE limit_slots ADD COLUMN waiting BIGINT NOT NULL DEFAULT 0;
ALTER TABLE limit_slots ADD COLUMN task_holds BIGINT NOT NULL DEFAULT 0;
UPDATE limit_slots s SET
    waiting = (SELECT COUNT(*) FROM limit_waiters w WHERE w.name = s.name AND w.key = s.key),
    task_holds = (SELECT COUNT(*) FROM limit_holds h WHERE h.name = s.name AND h.key = s.key AND h.task_id <> 0);
-- A line is admitted round-robin across its fairness values (`fair`: the value of the
-- limit's `fair_by`, '' without one), each value's waiters by priority, then arrival.
ALTER TABLE limit_waiters ADD COLUMN fair TEXT NOT NULL DEFAULT '';
DROP INDEX limit_waiters_order;
CREATE INDEX limit_waiters_order ON limit_waiters (name, key, fair, priority DESC, seq);
-- Each fairness value with work waiting, and its turn: the value with the lowest turn is
-- admitted next, and its turn moves one round on.
CREATE TABLE limit_fair (
    name    TEXT   NOT NULL,
    key     TEXT   NOT NULL,
    fair    TEXT   NOT NULL,
    turn    BIGINT NOT NULL,
    waiting BIGINT NOT NULL,
    PRIMARY KEY (name, key, fair)
);
CREATE INDEX limit_fair_turn ON limit_fair (name, key, turn, fair) WHERE waiting > 0;
INSERT INTO limit_fair (name, key, fair, turn, waiting)
    SELECT name, key, '', 0, COUNT(*) FROM limit_waiters GROUP BY name, key;
