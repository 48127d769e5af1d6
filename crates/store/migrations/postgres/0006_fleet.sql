-- What the dashboard's overview and filtered lists read at fleet scale (a million
-- entities) without scanning the fleet: counts kept by the statement that changes them,
-- and the indexes a filtered page is read through (the twin of migrations/sqlite/0006_fleet.sql).
--
-- Statement-level triggers with transition tables add one grouped upsert per statement,
-- whatever its row count (the write path changes many rows per statement). Several
-- instances write at once: each transaction adds to the rows of one of 64 shards (by its
-- transaction id), so two batches seldom wait for the same counter row; readers sum the
-- shards. A deadlock between two that do is retried like any other (conn.rs).

CREATE TABLE entity_counts (
    machine    TEXT     NOT NULL,
    state      TEXT     NOT NULL,
    run_status TEXT     NOT NULL,
    shard      SMALLINT NOT NULL,
    n          BIGINT   NOT NULL,
    PRIMARY KEY (machine, state, run_status, shard)
);
INSERT INTO entity_counts (machine, state, run_status, shard, n)
SELECT machine, state, run_status, 0, COUNT(*) FROM entities GROUP BY machine, state, run_status;

-- One function per statement kind: a trigger sees only the transition tables it declares.
-- An UPDATE keeps the row count: the change per key is what entered it minus what left it.
CREATE FUNCTION settle_entity_counts_insert() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO entity_counts (machine, state, run_status, shard, n)
    SELECT machine, state, run_status, (txid_current() % 64)::smallint, COUNT(*) FROM new_rows
    GROUP BY machine, state, run_status ORDER BY machine, state, run_status
    ON CONFLICT (machine, state, run_status, shard) DO UPDATE SET n = entity_counts.n + excluded.n;
    RETURN NULL;
END $$;
CREATE FUNCTION settle_entity_counts_update() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO entity_counts (machine, state, run_status, shard, n)
    SELECT machine, state, run_status, (txid_current() % 64)::smallint, SUM(d) FROM (
        SELECT machine, state, run_status, 1 AS d FROM new_rows
        UNION ALL
        SELECT machine, state, run_status, -1 FROM old_rows
    ) c
    GROUP BY machine, state, run_status HAVING SUM(d) <> 0 ORDER BY machine, state, run_status
    ON CONFLICT (machine, state, run_status, shard) DO UPDATE SET n = entity_counts.n + excluded.n;
    RETURN NULL;
END $$;
CREATE FUNCTION settle_entity_counts_delete() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO entity_counts (machine, state, run_status, shard, n)
    SELECT machine, state, run_status, (txid_current() % 64)::smallint, -COUNT(*) FROM old_rows
    GROUP BY machine, state, run_status ORDER BY machine, state, run_status
    ON CONFLICT (machine, state, run_status, shard) DO UPDATE SET n = entity_counts.n + excluded.n;
    RETURN NULL;
END $$;
CREATE TRIGGER entity_counts_insert AFTER INSERT ON entities REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION settle_entity_counts_insert();
CREATE TRIGGER entity_counts_update AFTER UPDATE ON entities REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION settle_entity_counts_update();
CREATE TRIGGER entity_counts_delete AFTER DELETE ON entities REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION settle_entity_counts_delete();

-- Operations per outcome (`open`: not ended).
CREATE TABLE operation_counts (
    outcome TEXT     NOT NULL,
    shard   SMALLINT NOT NULL,
    n       BIGINT   NOT NULL,
    PRIMARY KEY (outcome, shard)
);
INSERT INTO operation_counts (outcome, shard, n)
SELECT COALESCE(outcome, 'open'), 0, COUNT(*) FROM operations GROUP BY COALESCE(outcome, 'open');
CREATE FUNCTION settle_operation_counts_insert() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO operation_counts (outcome, shard, n)
    SELECT COALESCE(outcome, 'open'), (txid_current() % 64)::smallint, COUNT(*) FROM new_rows
    GROUP BY 1 ORDER BY 1
    ON CONFLICT (outcome, shard) DO UPDATE SET n = operation_counts.n + excluded.n;
    RETURN NULL;
END $$;
CREATE FUNCTION settle_operation_counts_update() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO operation_counts (outcome, shard, n)
    SELECT o, (txid_current() % 64)::smallint, SUM(d) FROM (
        SELECT COALESCE(outcome, 'open') AS o, 1 AS d FROM new_rows
        UNION ALL
        SELECT COALESCE(outcome, 'open'), -1 FROM old_rows
    ) c
    GROUP BY o HAVING SUM(d) <> 0 ORDER BY o
    ON CONFLICT (outcome, shard) DO UPDATE SET n = operation_counts.n + excluded.n;
    RETURN NULL;
END $$;
CREATE FUNCTION settle_operation_counts_delete() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO operation_counts (outcome, shard, n)
    SELECT COALESCE(outcome, 'open'), (txid_current() % 64)::smallint, -COUNT(*) FROM old_rows
    GROUP BY 1 ORDER BY 1
    ON CONFLICT (outcome, shard) DO UPDATE SET n = operation_counts.n + excluded.n;
    RETURN NULL;
END $$;
CREATE TRIGGER operation_counts_insert AFTER INSERT ON operations REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION settle_operation_counts_insert();
CREATE TRIGGER operation_counts_update AFTER UPDATE ON operations REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION settle_operation_counts_update();
CREATE TRIGGER operation_counts_delete AFTER DELETE ON operations REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION settle_operation_counts_delete();

-- Transitions (state entries) and errors per minute (`minute`: ms since the epoch / 60000).
CREATE TABLE minute_counts (
    minute      BIGINT   NOT NULL,
    shard       SMALLINT NOT NULL,
    transitions BIGINT   NOT NULL,
    errors      BIGINT   NOT NULL,
    PRIMARY KEY (minute, shard)
);
INSERT INTO minute_counts (minute, shard, transitions, errors)
SELECT minute, 0, SUM(t), SUM(e) FROM (
    SELECT at / 60000 AS minute, 1 AS t, 0 AS e FROM history
     WHERE to_state IS NOT NULL AND transition_kind IS NOT NULL
    UNION ALL
    SELECT at / 60000, 0, 1 FROM errors
) c GROUP BY minute;
CREATE FUNCTION settle_minute_transitions() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO minute_counts (minute, shard, transitions, errors)
    SELECT at / 60000, (txid_current() % 64)::smallint, COUNT(*), 0 FROM new_rows
     WHERE to_state IS NOT NULL AND transition_kind IS NOT NULL
    GROUP BY 1 ORDER BY 1
    ON CONFLICT (minute, shard) DO UPDATE SET transitions = minute_counts.transitions + excluded.transitions;
    RETURN NULL;
END $$;
CREATE FUNCTION settle_minute_errors() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO minute_counts (minute, shard, transitions, errors)
    SELECT at / 60000, (txid_current() % 64)::smallint, 0, COUNT(*) FROM new_rows
    GROUP BY 1 ORDER BY 1
    ON CONFLICT (minute, shard) DO UPDATE SET errors = minute_counts.errors + excluded.errors;
    RETURN NULL;
END $$;
CREATE TRIGGER minute_counts_transition AFTER INSERT ON history REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION settle_minute_transitions();
CREATE TRIGGER minute_counts_error AFTER INSERT ON errors REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION settle_minute_errors();

-- A page of one state's entities in id order, and of parked ones (a state change now
-- also moves an index entry: no longer a HOT update).
CREATE INDEX entities_machine_state ON entities (machine, state, id);
DROP INDEX entities_run_status;
CREATE INDEX entities_run_status ON entities (run_status, id) WHERE run_status <> 'active';
-- Keys compare byte-wise, whatever the database's collation (equality is unchanged): a key
-- prefix is then one range of the unique (machine, key) index, in the order SQLite keeps.
ALTER TABLE entities ALTER COLUMN key TYPE TEXT COLLATE "C";
