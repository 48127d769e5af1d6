-- Internal events (DESIGN §1, statecharts): an entity's action may raise an event on the
-- entity itself, processed after the transition commits and before anything else queued.
-- An entity's inbox head is its oldest internal item, else its oldest item; this index finds
-- the first without reading the rest of a long queue.
CREATE INDEX inbox_internal ON inbox (entity_id, id) WHERE kind = 'internal';
