//! What the SQL backends share besides the batch plan: column lists (both schemas have the
//! same columns in the same order) and JSON text encoding.

/// The columns an `EntityRow` is decoded from, in order.
pub(crate) const ENTITY_COLS: &str = "id, machine, key, state, properties, version, retry, created_at, entered_at, \
     auto_at, due_at, lease_owner, lease_until, request_id, fired, timer_at, run_status, sleep_until, recent_errors, \
     event_id, machine_hash";

/// The columns an `OperationRow` is decoded from, in order.
pub(crate) const OPERATION_COLS: &str = "id, request_id, name, machine, entity_key, started_at, ended_at, \
     first_response_at, outcome, error, restart_count, dimensions";

/// The columns an `EventRow` is decoded from, in order (`ev`: events). Its error's details
/// come from a subquery by id: a join would let the planner scan every error.
pub(crate) const EVENT_COLS: &str = "ev.id, ev.request_id, ev.event, ev.kind, ev.start_state, ev.end_state, \
     ev.start_time, ev.end_time, ev.rejected, ev.failed, \
     (SELECT er.details FROM errors er WHERE er.id = ev.error_id), ev.exception, ev.reason, ev.entered";

/// The columns an `AgentTask` is decoded from, in order (`t`: agent_tasks, `e`: entities).
pub(crate) const TASK_COLS: &str = "t.id, t.queue, e.machine, e.key, t.entity_id, t.state, t.action, \
     t.entity_version, t.retry, e.properties, e.recent_errors, t.request_id, t.status, t.attempt, t.token, t.agent, \
     t.locked_until, t.lock_ms, t.available_at, t.created_at, t.outcome, t.error, \
     (SELECT v.event FROM events v WHERE v.id = t.event_id), (SELECT v.params FROM events v WHERE v.id = t.event_id)";

/// JSON stored as text (properties, params, fired events, recent errors, dimensions).
pub(crate) fn json_text(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).expect("JSON values serialize")
}

/// A query of an entity's inbox head among the rows `filter` admits (a condition over
/// `inbox`'s columns): its oldest internal event (looked for when `internal`, a condition,
/// holds), else its oldest item — an internal event goes before anything queued
/// (docs/statecharts.md). Each branch reads one index entry (`inbox_internal`,
/// `inbox_entity`), however long the queue; the sort sees two rows at most. PostgreSQL's,
/// in one statement of a pipelined batch; SQLite probes the two indexes with two
/// statements, which costs it less.
pub(crate) fn inbox_head(filter: &str, internal: &str) -> String {
    format!(
        "SELECT * FROM (
             SELECT * FROM (SELECT * FROM inbox WHERE {internal} AND {filter} AND kind = 'internal'
                            ORDER BY id LIMIT 1) a
             UNION ALL
             SELECT * FROM (SELECT * FROM inbox WHERE {filter} ORDER BY id LIMIT 1) b
         ) h ORDER BY h.kind = 'internal' DESC, h.id LIMIT 1"
    )
}

/// A live entity's past trimmed ([`crate::Trim`]), in an order the foreign keys allow: each
/// statement takes the entity's id (`$1`), the cut-off time (`$2`, null: none by age) and how
/// many of the latest rows stay (`$3`, a huge number: none by count); the latest row of each
/// table always stays, and so do the event of the workflow the entity is in, events still
/// running and the errors those events name. `$N` reads alike on both backends (SQLite
/// numbers named parameters in the order they first appear).
pub(crate) const TRIM: [&str; 4] = [
    "DELETE FROM events WHERE entity_id = $1
       AND end_time IS NOT NULL
       AND id < (SELECT max(id) FROM events WHERE entity_id = $1)
       AND id <> COALESCE((SELECT event_id FROM entities WHERE id = $1), 0)
       AND (start_time < $2 OR id <= (SELECT id FROM events WHERE entity_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $3))",
    "DELETE FROM exceptions WHERE error_id IN (SELECT id FROM errors WHERE entity_id = $1
       AND id < (SELECT max(id) FROM errors WHERE entity_id = $1)
       AND id NOT IN (SELECT error_id FROM events WHERE entity_id = $1 AND error_id IS NOT NULL)
       AND (at < $2 OR id <= (SELECT id FROM errors WHERE entity_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $3)))
       AND id < (SELECT max(id) FROM exceptions)",
    "DELETE FROM errors WHERE entity_id = $1
       AND id < (SELECT max(id) FROM errors WHERE entity_id = $1)
       AND id NOT IN (SELECT error_id FROM events WHERE entity_id = $1 AND error_id IS NOT NULL)
       AND id NOT IN (SELECT error_id FROM exceptions WHERE error_id IS NOT NULL AND id = (SELECT max(id) FROM exceptions))
       AND (at < $2 OR id <= (SELECT id FROM errors WHERE entity_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $3))",
    "DELETE FROM history WHERE entity_id = $1
       AND id < (SELECT max(id) FROM history WHERE entity_id = $1)
       AND (at < $2 OR id <= (SELECT id FROM history WHERE entity_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $3))",
];

/// The parameters of [`TRIM`] for `t`: the cut-off, and how many stay (`i64::MAX`: all).
pub(crate) fn trim_params(t: &crate::Trim) -> (Option<i64>, i64) {
    (t.before, t.rows.map_or(i64::MAX, |n| i64::from(n.max(1))))
}

/// The statement of [`Store::operation_scan`](crate::Store::operation_scan): the window
/// (the `?2` operations before id `?1`, newest first) and its oldest id and size in one row
/// each joined with the window's operations that pass the filter (outcome `?3`, machine
/// `?4`, name `?5`, started in [`?6`, `?7`)), at most `?8`: the columns of
/// [`OPERATION_COLS`], then `low`, `n`. No operation passes: one row of nulls but those two.
/// `dollar`: PostgreSQL's placeholders (typed where a null is compared).
pub(crate) fn operation_scan_sql(dollar: bool) -> String {
    let p = |n: usize, ty: &str| if dollar { format!("${n}::{ty}") } else { format!("?{n}") };
    let (before, window, outcome, machine, name, after, until, limit) = (
        p(1, "bigint"),
        p(2, "bigint"),
        p(3, "text"),
        p(4, "text"),
        p(5, "text"),
        p(6, "bigint"),
        p(7, "bigint"),
        p(8, "bigint"),
    );
    format!(
        "WITH w AS (SELECT * FROM operations WHERE ({before} IS NULL OR id < {before}) ORDER BY id DESC LIMIT {window}),
              b AS (SELECT min(id) AS low, count(*) AS n FROM w)
         SELECT m.*, b.low, b.n FROM b LEFT JOIN (
             SELECT {OPERATION_COLS} FROM w
             WHERE ({outcome} IS NULL OR ({outcome} = 'open' AND ended_at IS NULL) OR outcome = {outcome})
               AND ({machine} IS NULL OR machine = {machine}) AND ({name} IS NULL OR name = {name})
               AND ({after} IS NULL OR started_at >= {after}) AND ({until} IS NULL OR started_at < {until})
             ORDER BY id DESC LIMIT {limit}) m ON 1 = 1
         ORDER BY m.id DESC"
    )
}
