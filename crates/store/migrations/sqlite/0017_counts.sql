-- The entity counts are kept by the writes that change them, as one change per (machine,
-- state, run status) per batch, not by a trigger firing twice per state change (the
-- plan's slots say what each entity was and is: plan/segment/write.rs; claims, pruning and
-- version moves add their own). Recounted once here.
DROP TRIGGER entity_counts_insert;
DROP TRIGGER entity_counts_update;
DROP TRIGGER entity_counts_delete;
DELETE FROM entity_counts;
INSERT INTO entity_counts (machine, state, run_status, n)
SELECT machine, state, run_status, COUNT(*) FROM entities GROUP BY machine, state, run_status;
