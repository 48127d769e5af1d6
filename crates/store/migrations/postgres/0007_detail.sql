-- Reads of one entity or one operation for the dashboard, through indexes on rows written
-- rarely (errors) or once per event (events), never per transition.
CREATE INDEX errors_entity ON errors (entity_id, id);
CREATE INDEX events_operation ON events (operation_id) WHERE operation_id IS NOT NULL;
