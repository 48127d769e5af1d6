-- The entity counts are kept by the writes that change them, as one upsert per statement
-- that adds or removes entities of a (machine, state, run status): the plan's changes per
-- segment (postgres/sets.rs), a claim that wakes sleeping or faulted entities
-- (postgres/claim.rs), pruning and a definition upgrade's renamed states (postgres/counts.rs
-- names them). The triggers they replace captured every updated entity's old and new rows
-- in transition tables and ran a function per statement. Each write still adds to the shard
-- of its transaction (its id modulo 64), so instances seldom wait for the same counter row.
-- Instances of an older version must stop before this migration runs: they would change
-- entities without counting them. Recounted once here.
DROP TRIGGER entity_counts_insert ON entities;
DROP TRIGGER entity_counts_update ON entities;
DROP TRIGGER entity_counts_delete ON entities;
DROP FUNCTION settle_entity_counts_insert();
DROP FUNCTION settle_entity_counts_update();
DROP FUNCTION settle_entity_counts_delete();
LOCK TABLE entities IN SHARE MODE;
DELETE FROM entity_counts;
INSERT INTO entity_counts (machine, state, run_status, shard, n)
SELECT machine, state, run_status, 0, COUNT(*) FROM entities GROUP BY machine, state, run_status;
