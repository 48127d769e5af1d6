-- Lists by how long entities have been in their state (DESIGN §9, "Lists at scale"): per
-- (state, machine), entities in the order they entered it (the rowid, their id, ends every
-- entry), so that "longest in `provisioning` first" reads one index range a pair. The
-- state leads, as in PostgreSQL's: no lookup by machine alone is drawn to it.
CREATE INDEX entities_entered ON entities (state, machine, entered_at);
