-- A successor says so in its row (`has_predecessors`, set with its first edge and never
-- cleared while one is left): a batch reads a committing entity's predecessors only when
-- its row does (sqlite/dialect.rs::lock). Edges written before the flag existed (migration
-- 0003) get it here.
UPDATE entities SET has_predecessors = 1
WHERE has_predecessors = 0 AND id IN (SELECT successor_id FROM successors);
