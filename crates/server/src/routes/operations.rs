//! Operations: what requests set in motion, and how it ended.

use axum::Json;
use axum::extract::State;
use settle_store::OperationFilter;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::contract::OUTCOME;
use crate::extract::{OptionalJsonBody, Path, Query};
use crate::model::{HistoryEntry, Operation, OperationList, OperationQuery, OperationTrace, TraceEntry};
use crate::paths::OperationPath;
use crate::problem::{Kind, Problem};
use crate::routes::{parse_limit, unknown_word};
use crate::state::AppState;
use settle_api::{CancelRequest, CancelResult, CanceledEntity};

/// Read routes of operations.
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list)).routes(routes!(get)).routes(routes!(trace))
}

/// Write routes of operations: cancel.
pub fn write() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(cancel))
}

/// Entities a cancel's answer lists, at most.
const CANCEL_ENTITIES: u64 = 1000;

/// How long a cancel waits for its entities (and, with `undone`, their undo).
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Cancels an operation: every entity it reached drops its queued events of it, stops the
/// work it does in it (a result in flight is discarded, its agent task canceled) and runs
/// its machine's `cancel` event where that is valid and its state is the operation's
/// doing; work stopped with no undo leaves it paused. One bulk operation
/// (`{id}/cancel`) goes through them; each entity's part is the operation
/// `{id}/cancel/{entity id}`. 200 once every entity's work has stopped (with `undone`,
/// once the operation and every undo ended); 202 if that takes longer than 30 s (it goes
/// on). Asking again answers the same cancel (`replayed`).
#[utoipa::path(
    post,
    operation_id = "cancelOperation",
    path = "/v1/operations/{id}/cancel",
    tag = "operations",
    params(OperationPath),
    request_body(content = Option<CancelRequest>, description = "why, and whether to wait for the undo (optional)", content_type = "application/json"),
    responses(
        (status = 200, description = "the cancel went through every entity", body = CancelResult),
        (status = 202, description = "the cancel goes on; the answer shows it so far", body = CancelResult),
    )
)]
async fn cancel(
    State(s): State<AppState>,
    Path(OperationPath { id }): Path<OperationPath>,
    OptionalJsonBody(req): OptionalJsonBody<CancelRequest>,
) -> Result<axum::response::Response, Problem> {
    use axum::response::IntoResponse;
    let req = req.unwrap_or_default();
    let (body, finished) =
        cancel_and_wait(s.engine(), &id, req.reason.as_deref(), req.undone, CANCEL_WAIT, |e| s.entity(e)).await?;
    let status = if finished { axum::http::StatusCode::OK } else { axum::http::StatusCode::ACCEPTED };
    Ok((status, Json(body)).into_response())
}

/// Cancels the operation `id` on `engine` and waits at most `wait` for every entity's work
/// in it to stop (with `undone`, for every undo to end): the answer of
/// `POST /v1/operations/{id}/cancel` (each entity shown by `entity`), and whether the wait
/// saw it through (`false`: it goes on). `settle cancel` on the database answers the same.
pub async fn cancel_and_wait<S: settle_store::Store + Clone>(
    engine: &settle_engine::Engine<S>,
    id: &str,
    reason: Option<&str>,
    undone: bool,
    wait: std::time::Duration,
    entity: impl Fn(&settle_store::EntityRow) -> settle_api::Entity,
) -> Result<(CancelResult, bool), settle_engine::Error> {
    let started = engine.cancel_operation(id, reason).await?;
    let finished = match engine.cancel_wait(id, undone, wait).await {
        Ok(_) => true,
        Err(settle_engine::Error::Timeout { .. }) => false,
        Err(e) => return Err(e),
    };
    let operation = engine.operation(id).await?.unwrap_or(started.operation);
    let bulk = engine.bulk_get(&started.bulk.request_id).await?.unwrap_or(started.bulk);
    let entities = engine
        .cancel_parts(id, CANCEL_ENTITIES)
        .await?
        .into_iter()
        .map(|p| CanceledEntity { entity: entity(&p.entity), part: p.part.as_ref().map(Operation::from), did: p.did })
        .collect();
    let body = CancelResult {
        operation: Operation::from(&operation),
        bulk: settle_api::Bulk::from(&bulk),
        replayed: started.replayed,
        entities,
    };
    Ok((body, finished))
}

/// Operations, newest first, filtered by outcome, machine, name and start time. A page
/// looks at 5,000 operations at most: with filters it may hold fewer than `limit`, and
/// `next` goes on past what it looked at.
#[utoipa::path(
    get,
    operation_id = "listOperations",
    path = "/v1/operations",
    tag = "operations",
    params(OperationQuery),
    responses(
        (status = 200, description = "operations, newest first", body = OperationList),
    )
)]
async fn list(State(s): State<AppState>, Query(q): Query<OperationQuery>) -> Result<Json<OperationList>, Problem> {
    if let Some(o) = q.outcome.as_deref()
        && !OUTCOME.contains(&o)
    {
        return Err(unknown_word("outcome", "outcome", o, OUTCOME));
    }
    let limit = parse_limit(q.limit.as_deref())?;
    let before = match q.before.as_deref() {
        None => None,
        Some(b) => {
            Some(b.parse::<i64>().ok().filter(|_| crate::contract::OPERATION_CURSOR.matches(b)).ok_or_else(|| {
                Problem::new(Kind::BadRequest, format!("before must be a `next` of this list, not `{b}`"))
                    .field("before")
            })?)
        }
    };
    let now = s.engine().clock().now_ms();
    let time = |field: &str, text: Option<&str>| {
        text.map(|t| {
            settle_core::time::parse_time(t, now)
                .map_err(|e| Problem::new(Kind::BadRequest, format!("{field}: {e}")).field(field))
        })
        .transpose()
    };
    let filter = OperationFilter {
        outcome: q.outcome,
        machine: q.machine,
        name: q.name,
        started_after: time("started_after", q.started_after.as_deref())?,
        started_before: time("started_before", q.started_before.as_deref())?,
    };
    let store = s.engine().store();
    let mut window = settle_store::Store::operation_scan(store, filter, before, WINDOW, limit + 1).await?;
    let more = window.items.len() as u64 > limit;
    window.items.truncate(limit as usize);
    let next = match window.items.last() {
        Some(o) if more => Some(o.id),
        _ => window.low,
    };
    let items = window.items.iter().map(Operation::from).collect();
    Ok(Json(OperationList { items, next: next.map(|n| n.to_string()) }))
}

/// How many operations one page looks at, at most: with filters, a page may hold fewer
/// than its limit (go on with `next` while there is one), and costs the same however many
/// operations are kept.
const WINDOW: u64 = 5_000;

/// One operation, by request id.
#[utoipa::path(
    get,
    operation_id = "getOperation",
    path = "/v1/operations/{id}",
    tag = "operations",
    params(OperationPath),
    responses(
        (status = 200, description = "the operation", body = Operation),
    )
)]
async fn get(
    State(s): State<AppState>,
    Path(OperationPath { id }): Path<OperationPath>,
) -> Result<Json<Operation>, Problem> {
    Ok(Json(Operation::from(&find_operation(&s, &id).await?)))
}

/// The operation of request id `id`, or 404.
async fn find_operation(s: &AppState, id: &str) -> Result<settle_store::OperationRow, Problem> {
    s.engine().operation(id).await?.ok_or_else(|| {
        Problem::new(Kind::UnknownOperation, format!("no operation with request id `{id}`")).with("request_id", id)
    })
}

/// Entities listed in an operation's trace, at most.
const TRACE_ENTITIES: u64 = 1000;

/// Every entity and transition one operation touched: the entity it started on, those its
/// events reached, and the history rows its request id caused there.
#[utoipa::path(
    get,
    operation_id = "getOperationTrace",
    path = "/v1/operations/{id}/trace",
    tag = "operations",
    params(OperationPath),
    responses(
        (status = 200, description = "the operation with the entities and transitions it touched", body = OperationTrace),
    )
)]
async fn trace(
    State(s): State<AppState>,
    Path(OperationPath { id }): Path<OperationPath>,
) -> Result<Json<OperationTrace>, Problem> {
    let row = find_operation(&s, &id).await?;
    let t = settle_store::Store::operation_trace(s.engine().store(), &id, TRACE_ENTITIES).await?;
    let transitions = t
        .transitions
        .iter()
        .filter_map(|h| {
            let e = t.entities.iter().find(|e| e.id == h.entity_id)?;
            Some(TraceEntry { machine: e.machine.to_string(), key: e.key.to_string(), entry: HistoryEntry::from(h) })
        })
        .collect();
    Ok(Json(OperationTrace {
        operation: Operation::from(&row),
        entities: t.entities.iter().map(|e| s.entity(e)).collect(),
        transitions,
        truncated: t.truncated,
    }))
}
