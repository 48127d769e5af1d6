-- Retention (DESIGN §9): entities ended long enough ago are removed with every row they
-- left. `ended_at` is when an entity entered the end state (terminal or deleted) it is in,
-- written by the commit that enters it; the partial index holds only ended entities, so
-- finding those past their retention costs nothing on the live write path.
ALTER TABLE entities ADD COLUMN ended_at INTEGER;
UPDATE entities SET ended_at = entered_at
 WHERE EXISTS (
    SELECT 1 FROM machines m, json_each(m.definition, '$.states') s
     WHERE m.name = entities.machine
       AND json_extract(s.value, '$.name') = entities.state
       AND json_extract(s.value, '$.kind') IN ('terminal', 'deleted'));
CREATE INDEX entities_ended ON entities (machine, state, ended_at) WHERE ended_at IS NOT NULL;
-- A purge finds each table's rows of an entity by index.
CREATE INDEX events_entity ON events (entity_id);
CREATE INDEX exceptions_error ON exceptions (error_id);
DROP INDEX agent_tasks_entity;
CREATE INDEX agent_tasks_entity ON agent_tasks (entity_id);
-- Ended operations and finished tasks go by age.
CREATE INDEX operations_ended ON operations (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX agent_tasks_finished ON agent_tasks (finished_at) WHERE finished_at IS NOT NULL;
