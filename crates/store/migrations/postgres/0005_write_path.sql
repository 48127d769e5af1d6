-- The set-based write path (crate::plan): what it costs per batch, not per row.
--
-- Foreign keys from the hot tables to `entities` cost a lookup and a row lock per inserted
-- row (a history row, an inbox item, an event...), about a fifth of a batch's time. The
-- write path keeps those references intact by construction (it writes rows only for
-- entities it has locked or just created, and entities are never deleted), so PostgreSQL
-- drops them. SQLite keeps its foreign keys: there a check is an in-process index probe.
ALTER TABLE inbox DROP CONSTRAINT IF EXISTS inbox_entity_id_fkey;
ALTER TABLE history DROP CONSTRAINT IF EXISTS history_entity_id_fkey;
ALTER TABLE successors DROP CONSTRAINT IF EXISTS successors_predecessor_id_fkey;
ALTER TABLE successors DROP CONSTRAINT IF EXISTS successors_successor_id_fkey;
ALTER TABLE timers DROP CONSTRAINT IF EXISTS timers_entity_id_fkey;
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_operation_id_fkey;
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_entity_id_fkey;
ALTER TABLE exceptions DROP CONSTRAINT IF EXISTS exceptions_error_id_fkey;
ALTER TABLE agent_tasks DROP CONSTRAINT IF EXISTS agent_tasks_entity_id_fkey;

-- Room in each page for the new version of a row: a step that changes no indexed column
-- (a held entity moving from one unstable state to the next) is then a HOT update, which
-- writes no index entry.
ALTER TABLE entities SET (fillfactor = 80);

-- What a waiting caller needs to know of a processed event, whichever instance processed
-- it: why it was rejected (or how its action failed), and the state its action entered
-- (the twin of migrations/sqlite/0005_outcomes.sql).
ALTER TABLE events ADD COLUMN reason TEXT;
ALTER TABLE events ADD COLUMN entered TEXT;
