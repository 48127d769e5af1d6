//! Bulk operations: a dry run, then one durable operation applying a command or an event
//! to every entity matching a filter, with its progress; cancel.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use settle_engine::{BulkAction, BulkRequest as Request, DryRun, Selection};
use settle_store::EntityRow;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::extract::{IdempotencyKey, JsonBody, Path};
use crate::model::{Bulk, BulkDryRun, BulkFilter, BulkList, BulkRequest, Entity};
use crate::paths::BulkPath;
use crate::problem::{Kind, Problem};
use crate::state::AppState;

/// Read routes.
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list)).routes(routes!(get))
}

/// Write routes (operators).
pub fn write() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(start)).routes(routes!(cancel))
}

/// Where a bulk operation is followed.
pub(crate) fn bulk_location(request_id: &str) -> String {
    format!("/v1/bulk/{}", crate::routes::encode_segment(request_id))
}

/// The engine's selection of a request's filter, its times read at `now` (epoch ms); a
/// problem names the member at fault.
pub fn selection(f: &BulkFilter, now: i64) -> Result<Selection, Problem> {
    let text = settle_engine::NarrowText {
        expr: f.expr.as_deref(),
        error: f.error.as_deref(),
        created_after: f.created_after.as_deref(),
        created_before: f.created_before.as_deref(),
        entered_after: f.entered_after.as_deref(),
        entered_before: f.entered_before.as_deref(),
    };
    Ok(Selection {
        machine: f.machine.clone(),
        state: f.state.clone(),
        status: f.status.clone(),
        prefix: f.prefix.clone(),
        health: f.health.clone(),
        narrow: crate::routes::narrow(text, now, Kind::InvalidBulk, "filter.")?,
        successors_of: None,
        reached_by: None,
    })
}

/// How many a dry run shows.
pub const SAMPLE: usize = 10;

/// Starts a bulk operation: `action` (`pause`, `resume`, `retry`, `release`, `kill`, or
/// `raise` with `event` and `params`) on every entity matching `filter` (at least one of
/// machine, state, status, prefix, health, where, error, a time range), with a `reason`, at most `rate` entities a
/// second. 202 and `Location: /v1/bulk/{id}`; a replayed `Idempotency-Key` 200 with that
/// operation. With `dry_run`: 200, how many match now and the first few; nothing done.
#[utoipa::path(
    post,
    operation_id = "startBulk",
    path = "/v1/bulk",
    tag = "bulk",
    params(("Idempotency-Key" = Option<String>, Header, description = "the bulk operation's request id")),
    request_body = BulkRequest,
    responses(
        (status = 202, description = "started", body = Bulk),
        (status = 200, description = "a dry run's count and sample (`BulkDryRun`), or the operation a replayed key started", body = BulkDryRun),
    )
)]
async fn start(
    State(s): State<AppState>,
    IdempotencyKey(request_id): IdempotencyKey,
    JsonBody(req): JsonBody<BulkRequest>,
) -> Result<Response, Problem> {
    let params = req.params.clone().unwrap_or(Value::Null);
    let action = BulkAction::parse(&req.action, req.event.as_deref(), params).map_err(invalid)?;
    let sel = selection(&req.filter, s.engine().clock().now_ms())?;
    if req.dry_run {
        let dry = s.engine().bulk_dry_run(&sel, SAMPLE).await?;
        return Ok(Json(dry_run_body(&req, &dry, |e| s.entity(e))).into_response());
    }
    let request = Request {
        request_id,
        action,
        selection: sel,
        reason: req.reason.clone().unwrap_or_default(),
        rate: req.rate.unwrap_or(settle_engine::DEFAULT_RATE),
        priority: req.priority,
    };
    let (row, new) = s.engine().bulk_start(request).await?;
    let status = if new { StatusCode::ACCEPTED } else { StatusCode::OK };
    Ok((status, [(header::LOCATION, bulk_location(&row.request_id))], Json(Bulk::from(&row))).into_response())
}

/// A dry run's answer to `req`: its count and sample, each entity shown by `entity`.
pub fn dry_run_body(req: &BulkRequest, dry: &DryRun, entity: impl Fn(&EntityRow) -> Entity) -> BulkDryRun {
    BulkDryRun {
        action: req.action.clone(),
        filter: req.filter.clone(),
        count: dry.count,
        more: dry.more,
        bound: settle_engine::COUNT_BOUND,
        sample: dry.sample.iter().map(entity).collect(),
    }
}

fn invalid(message: String) -> Problem {
    settle_engine::Error::Bulk(message).into()
}

/// The newest bulk operations (at most 100), newest first.
#[utoipa::path(
    get,
    operation_id = "listBulk",
    path = "/v1/bulk",
    tag = "bulk",
    responses((status = 200, description = "bulk operations, newest first", body = BulkList))
)]
async fn list(State(s): State<AppState>) -> Result<Json<BulkList>, Problem> {
    let rows = s.engine().bulk_list(100).await?;
    Ok(Json(BulkList { items: rows.iter().map(Bulk::from).collect() }))
}

/// One bulk operation and its progress.
#[utoipa::path(
    get,
    operation_id = "getBulk",
    path = "/v1/bulk/{id}",
    tag = "bulk",
    params(BulkPath),
    responses((status = 200, description = "the bulk operation", body = Bulk))
)]
async fn get(State(s): State<AppState>, Path(BulkPath { id }): Path<BulkPath>) -> Result<Json<Bulk>, Problem> {
    match s.engine().bulk_get(&id).await? {
        Some(row) => Ok(Json(Bulk::from(&row))),
        None => Err(unknown(&id)),
    }
}

/// Cancels a running bulk operation: the page in flight finishes, nothing after it starts.
/// The operation afterwards (one that had ended is left as it was).
#[utoipa::path(
    post,
    operation_id = "cancelBulk",
    path = "/v1/bulk/{id}/cancel",
    tag = "bulk",
    params(BulkPath),
    responses((status = 200, description = "the bulk operation afterwards", body = Bulk))
)]
async fn cancel(State(s): State<AppState>, Path(BulkPath { id }): Path<BulkPath>) -> Result<Json<Bulk>, Problem> {
    match s.engine().bulk_cancel(&id).await? {
        Some(row) => Ok(Json(Bulk::from(&row))),
        None => Err(unknown(&id)),
    }
}

fn unknown(id: &str) -> Problem {
    Problem::new(Kind::UnknownBulk, format!("no bulk operation `{id}`")).with("request_id", id.to_string())
}
