//! Raising events: `POST /v1/machines/{machine}/entities/{key}/events/{event}`.
//!
//! Bad input (unknown machine, entity or event, invalid parameters, a deleted or killed
//! entity) is answered before anything is written. An event that is not valid in the
//! state of an entity *at rest* (stable state, nothing queued, no auto action pending,
//! not leased) is refused at once with 409 and is not recorded: at that moment nothing
//! could make it valid before its turn. Otherwise the event is queued durably and the
//! engine decides in order; a rejection then is recorded in the entity's history, and is
//! the operation's outcome (202) or a 409 (`wait=stable`).

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use settle_engine::{EventOutcome, RaiseOptions, Wait};
use settle_store::RunStatus;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::contract::WAIT;
use crate::extract::{IdempotencyKey, OptionalJsonBody, Path, Query};
use crate::model::{EventCheck, RaiseAccepted, RaiseDone, RaiseQuery};
use crate::operation_location;
use crate::paths::EventPath;
use crate::problem::{Kind, Problem};
use crate::routes::{live_entity, parse_duration, unknown_word};
use crate::state::AppState;

/// Write routes of events.
pub fn write() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(raise))
}

/// Read routes of events: what an event would do (nothing is written).
pub fn read() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(check))
}

/// What the event would do to the entity if raised now with these parameters: fire (with
/// the action its guards choose), be ignored, or be refused and why. The body is the
/// event's parameters, as for a raise. Nothing is written.
#[utoipa::path(
    post,
    operation_id = "checkEvent",
    path = "/v1/machines/{machine}/entities/{key}/events/{event}/check",
    tag = "events",
    params(EventPath),
    request_body(content = Option<Object>, description = "the event's parameters", content_type = "application/json"),
    responses(
        (status = 200, description = "the verdict", body = EventCheck),
    )
)]
async fn check(
    State(s): State<AppState>,
    Path(EventPath { machine, key, event }): Path<EventPath>,
    OptionalJsonBody(params): OptionalJsonBody<Value>,
) -> Result<Json<EventCheck>, Problem> {
    let m = s.machine(&machine)?.clone();
    let params = params.unwrap_or(Value::Null);
    settle_core::step::check_raise(&m, &event, &params)?;
    live_entity(&s, &machine, &key).await?;
    let (entity, permission) = s.engine().can_fire(&machine, &key, &event, &params).await?;
    Ok(Json(EventCheck { event, state: entity.state.to_string(), verdict: crate::model::verdict_of(&permission) }))
}

/// Raises an event on an entity. The body is the event's parameters (a JSON object; an
/// empty body is no parameters). Without `wait`: 202 once the event is durably queued,
/// with `Location: /v1/operations/{id}`. With `wait=stable`: 200 once the entity is at
/// rest again; with `wait=operation`: 200 once the operation has ended (every entity it
/// reached at rest), the operation in the body. Either way 409 if the event was rejected
/// (reason and state in the problem), 422 `event-failed` if its action failed (nothing
/// changed), 504 if the wait ran out (the event is still processed; the problem links the
/// operation).
#[utoipa::path(
    post,
    operation_id = "raiseEvent",
    path = "/v1/machines/{machine}/entities/{key}/events/{event}",
    tag = "events",
    params(EventPath, ("Idempotency-Key" = Option<String>, Header, description = "the operation's request id"), RaiseQuery),
    request_body(content = Option<Object>, description = "the event's parameters", content_type = "application/json"),
    responses(
        (status = 202, description = "queued; Location is the operation", body = RaiseAccepted),
        (status = 200, description = "wait=stable: the outcome and the entity at rest; wait=operation: also the operation, ended", body = RaiseDone),
    )
)]
async fn raise(
    State(s): State<AppState>,
    Path(EventPath { machine, key, event }): Path<EventPath>,
    Query(q): Query<RaiseQuery>,
    IdempotencyKey(request_id): IdempotencyKey,
    OptionalJsonBody(params): OptionalJsonBody<Value>,
) -> Result<Response, Problem> {
    let m = s.machine(&machine)?.clone();
    let wait = match q.wait.as_deref() {
        None => Wait::Queued,
        Some("stable") => Wait::Stable,
        Some("operation") => Wait::Operation,
        Some(other) => {
            return Err(unknown_word("wait", "wait", other, WAIT));
        }
    };
    // A timeout without a wait has nothing to bound; it is checked all the same.
    let timeout = match q.timeout.as_deref() {
        None => s.config().default_wait,
        Some(t) => parse_duration("timeout", t)?.min(s.config().max_wait),
    };
    let params = params.unwrap_or(Value::Null);
    settle_core::step::check_raise(&m, &event, &params)?;
    let e = live_entity(&s, &machine, &key).await?;
    if e.run_status == RunStatus::Killed {
        return Err(Problem::from(settle_engine::Error::Killed { machine, key }));
    }
    let mut options = RaiseOptions::wait(wait).params(params).timeout(timeout).refuse_at_rest();
    if let Some(id) = request_id {
        options = options.request_id(id);
    }
    if let Some(p) = q.priority {
        options = options.priority(p);
    }
    let raised = s.engine().raise(&machine, &key, &event, options).await?;
    if raised.refused
        && let Some(EventOutcome::Rejected { state, reason }) = &raised.outcome
    {
        // Refused at once, unrecorded: the entity is at rest and the event is not valid
        // in its state.
        return Err(rejected(&machine, &key, &event, state, reason));
    }
    let location = operation_location(&raised.request_id);
    if wait == Wait::Queued {
        let body =
            RaiseAccepted { request_id: raised.request_id, operation: location.clone(), replayed: raised.replayed };
        return Ok((StatusCode::ACCEPTED, [(header::LOCATION, location)], Json(body)).into_response());
    }
    let entity = raised.entity.as_ref().map(|e| s.entity(e));
    match &raised.outcome {
        None | Some(EventOutcome::Accepted { .. } | EventOutcome::Ignored { .. }) => {
            let body = RaiseDone {
                request_id: raised.request_id.clone(),
                outcome: raised.outcome.as_ref().map(crate::model::outcome_of),
                entity,
                replayed: raised.replayed,
                operation: raised.operation.as_ref().map(crate::model::Operation::from),
            };
            Ok((StatusCode::OK, [(header::LOCATION, location)], Json(body)).into_response())
        }
        Some(EventOutcome::Rejected { state, reason }) => Err(rejected(&machine, &key, &event, state, reason)
            .with("request_id", raised.request_id.clone())
            .with("operation", location)),
        Some(EventOutcome::Failed { error }) => {
            Err(Problem::new(Kind::EventFailed, format!("event `{event}` failed: {error}"))
                .with("machine", machine)
                .with("key", key)
                .with("event", event)
                .with("error", error.clone())
                .with("request_id", raised.request_id.clone())
                .with("operation", location))
        }
    }
}

fn rejected(machine: &str, key: &str, event: &str, state: &str, reason: &str) -> Problem {
    Problem::new(Kind::EventRejected, format!("event `{event}` rejected in state `{state}`: {reason}"))
        .with("machine", machine)
        .with("key", key)
        .with("event", event)
        .with("state", state)
        .with("reason", reason)
}
