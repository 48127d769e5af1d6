-- The operation counts and the minutes' transitions and errors are kept by the writes that
-- change them (sqlite/counts.rs: one change per outcome and per minute per batch, taken
-- from what the statements returned), not by a trigger per row. The operations are
-- recounted once here; the minutes cannot be (pruned history no longer holds theirs) and
-- stay as the triggers left them.
DROP TRIGGER operation_counts_insert;
DROP TRIGGER operation_counts_update;
DROP TRIGGER operation_counts_delete;
DROP TRIGGER minute_counts_transition;
DROP TRIGGER minute_counts_error;
DELETE FROM operation_counts;
INSERT INTO operation_counts (outcome, n)
SELECT COALESCE(outcome, 'open'), COUNT(*) FROM operations GROUP BY COALESCE(outcome, 'open');
