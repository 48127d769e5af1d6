-- Retention (DESIGN §9): entities ended long enough ago are removed with every row they
-- left. `ended_at` is when an entity entered the end state (terminal or deleted) it is in,
-- written by the commit that enters it; the partial index holds only ended entities, so
-- finding those past their retention costs nothing on the live write path.
ALTER TABLE entities ADD COLUMN ended_at BIGINT;
UPDATE entities e SET ended_at = e.entered_at
  FROM (SELECT DISTINCT m.name, s ->> 'name' AS state
          FROM machines m, jsonb_array_elements(m.definition::jsonb -> 'states') s
         WHERE s ->> 'kind' IN ('terminal', 'deleted')) ends
 WHERE e.machine = ends.name AND e.state = ends.state;
CREATE INDEX entities_ended ON entities (machine, state, ended_at, id) WHERE ended_at IS NOT NULL;
-- A purge finds each table's rows of an entity by index.
CREATE INDEX events_entity ON events (entity_id);
CREATE INDEX exceptions_error ON exceptions (error_id);
DROP INDEX agent_tasks_entity;
CREATE INDEX agent_tasks_entity ON agent_tasks (entity_id);
-- Ended operations and finished tasks go by age.
CREATE INDEX operations_ended ON operations (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX agent_tasks_finished ON agent_tasks (finished_at) WHERE finished_at IS NOT NULL;
