-- Lists by how long entities have been in their state (DESIGN §9, "Lists at scale"): per
-- (state, machine), entities in the order they entered it, then by id, so that "longest
-- in `provisioning` first" reads one index range a pair. The state leads: an index that
-- starts with the machine alone tempts the planner away from (machine, key) for a lookup
-- by key on a table whose statistics are not taken yet (measured: half the throughput of
-- `bench chain`).
CREATE INDEX entities_entered ON entities (state, machine, entered_at, id);
