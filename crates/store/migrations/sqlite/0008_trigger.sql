-- What an action runs for (DESIGN §5): an event's parameters are stored with it, and an
-- agent task names the event whose workflow its state entry belongs to (its trigger).
ALTER TABLE events ADD COLUMN params TEXT;
ALTER TABLE agent_tasks ADD COLUMN event_id INTEGER;
