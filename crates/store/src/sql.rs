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
