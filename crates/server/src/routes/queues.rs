//! Agent queues (DESIGN §5, Scheduler-Agent-Supervisor): agents lease tasks with a long
//! poll, heartbeat to keep them, and report `complete` or `fail` with their lease token.
//!
//! - `POST /v1/queues/{queue}/lease` `{agent, max?, wait_ms?}` → `{tasks: [...]}` (empty
//!   when nothing came within the wait, capped by the server's `max_wait`).
//! - `POST /v1/tasks/{id}/heartbeat` `{token}` → `{locked_until}`.
//! - `POST /v1/tasks/{id}/complete` `{token, target, properties?, …, next?}` → 202
//!   `{accepted, replayed, tasks?}`.
//! - `POST /v1/tasks/{id}/fail` `{token, error, retryable?, next?}` → 202 `{accepted,
//!   replayed, tasks?}`.
//!
//! - `POST /v1/tasks/reports` `{reports: [{task, complete | fail}], next?}` → 200
//!   `{results: [{task, accepted, replayed, problem?}], tasks?}`: many reports in one request,
//!   each applied or refused on its own.
//!
//! A report's `next` `{queue, agent, max?}` leases the next tasks in the same request once
//! the report is accepted (without waiting): an agent with work queued makes one round trip
//! per task. It is checked before the report is, so a bad `next` changes nothing.
//! A heartbeat or report after the lease expired, with a superseded token, or on a task
//! canceled or reported by another lease is refused with 409 `task-refused` and changes
//! nothing. A report again with the token whose report was applied is a replay: 202 with
//! `replayed: true`, nothing changes.
//! An agent token serves only its named queues. Long polls waiting at once are bounded per
//! queue and per token ([`crate::polls`]); beyond, 429 `too-many-polls` with `Retry-After`.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use settle_store::{AgentTask, TaskRefusal, TaskResult};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth::Caller;
use crate::contract::{AGENT, TASKS, WAIT_MS};
use crate::extract::{JsonBody, Path};
use crate::model::{
    Accepted, CompleteRequest, Extended, FailRequest, HeartbeatRequest, LeaseRequest, Leased, NextTasks, ReportMany,
    ReportResult, ReportsHandled, Task, TaskReport,
};
use crate::paths::{QueuePath, TaskPath};
use crate::problem::{Kind, Problem};
use crate::state::AppState;

/// Routes of the agent queues.
pub fn agent() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(lease))
        .routes(routes!(heartbeat))
        .routes(routes!(complete))
        .routes(routes!(fail))
        .routes(routes!(report_many))
}

fn check_queue(s: &AppState, caller: &Caller, queue: &str) -> Result<(), Problem> {
    caller.authorize_queue(queue)?;
    if !s.engine().agent_queues().iter().any(|q| q == queue) {
        let served = s.engine().agent_queues().join(", ");
        return Err(Problem::new(
            Kind::UnknownQueue,
            format!("no action is bound to queue `{queue}` (queues: {served})"),
        )
        .with("queue", queue));
    }
    Ok(())
}

fn task_json(s: &AppState, t: AgentTask) -> Task {
    let (mut targets, mut requires) = (Vec::new(), serde_json::Map::new());
    let (mut may_create, mut may_raise) = (Vec::new(), Vec::new());
    if let Ok(m) = s.machine(&t.machine)
        && let Some(a) = m.action(&t.action)
    {
        may_create = a.may_create.iter().flatten().map(|m| m.to_string()).collect();
        may_raise = a.may_raise.iter().flatten().map(|e| e.to_string()).collect();
        for target in &a.targets {
            let required = settle_core::step::required_to_enter(&m, &target.state);
            requires.insert(target.state.to_string(), serde_json::json!(required));
            targets.push(target.state.to_string());
        }
    }
    Task {
        id: t.id,
        queue: t.queue,
        machine: t.machine.to_string(),
        key: t.key.to_string(),
        state: t.state.to_string(),
        action: t.action.to_string(),
        targets,
        requires,
        may_create,
        may_raise,
        attempt: t.attempt,
        retry: t.retry,
        errors: t.errors,
        properties: t.properties,
        request_id: t.request_id,
        event: t.event.map(|e| e.to_string()),
        params: t.params,
        token: t.token.unwrap_or_default(),
        locked_until: t.locked_until.unwrap_or_default(),
        lock_ms: t.lock_ms,
    }
}

/// A heartbeat's or report's refusal, as the caller is told it (the task is read once, by
/// the store, which checks its queue, lease and target).
fn refused(e: settle_engine::Error) -> Problem {
    match e {
        settle_engine::Error::Task(TaskRefusal::Unknown { task }) => {
            Problem::new(Kind::UnknownTask, format!("no task {task}")).with("task", task)
        }
        // A task of a queue the caller does not serve is, to it, no task: its id and queue
        // are not told.
        settle_engine::Error::Task(TaskRefusal::QueueForbidden { task, .. }) => {
            Problem::new(Kind::UnknownTask, format!("no task {task} (of the queues this caller serves)"))
                .with("task", task)
        }
        settle_engine::Error::Task(TaskRefusal::Refused { task, reason }) => {
            Problem::new(Kind::TaskRefused, format!("task {task}: {reason}")).with("task", task).with("reason", reason)
        }
        settle_engine::Error::Task(TaskRefusal::BadReport { task, field, reason }) => {
            Problem::new(Kind::InvalidReport, format!("task {task}: {field}: {reason}"))
                .field(&field)
                .with("task", task)
        }
        other => other.into(),
    }
}

/// Leases tasks from a queue: waits up to `wait_ms` for one (a long poll) and answers the
/// tasks leased, each with its lease token, or none.
#[utoipa::path(
    post,
    operation_id = "leaseTasks",
    path = "/v1/queues/{queue}/lease",
    tag = "agents",
    params(QueuePath),
    request_body(content = LeaseRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "the tasks leased (possibly none)", body = Leased),
    )
)]
async fn lease(
    State(s): State<AppState>,
    caller: Caller,
    Path(QueuePath { queue }): Path<QueuePath>,
    JsonBody(req): JsonBody<LeaseRequest>,
) -> Result<Json<Leased>, Problem> {
    let max = lease_args(&s, &caller, &queue, &req.agent, req.max, "")?;
    let wait_ms = req.wait_ms.unwrap_or(WAIT_MS.default);
    if !WAIT_MS.contains(wait_ms) {
        return Err(Problem::new(
            Kind::InvalidBody,
            format!("wait_ms must be from 0 to {} (a day), not {wait_ms}", WAIT_MS.max),
        )
        .field("wait_ms"));
    }
    let wait = Duration::from_millis(wait_ms).min(s.config().max_wait);
    let _permit = if wait.is_zero() {
        None
    } else {
        let permit = s.polls().acquire(&queue, &caller);
        if permit.is_err() {
            s.refusals().count(crate::metrics::Refusal::TooManyPolls);
        }
        Some(permit?)
    };
    let tasks = s.engine().agent_lease(&queue, &req.agent, max, wait).await?;
    Ok(Json(Leased { tasks: tasks.into_iter().map(|t| task_json(&s, t)).collect() }))
}

/// Checks a lease's queue (known, and the caller's), agent name and count (`field`: where
/// they are in the request body, `""` or `"next."`); answers the count.
fn lease_args(
    s: &AppState,
    caller: &Caller,
    queue: &str,
    agent: &str,
    max: Option<u64>,
    field: &str,
) -> Result<usize, Problem> {
    check_queue(s, caller, queue).map_err(|p| if field.is_empty() { p } else { p.field(format!("{field}queue")) })?;
    lease_shape(agent, max, field)
}

/// Checks a lease's agent name and count (`field` as for [`lease_args`]); answers the count.
fn lease_shape(agent: &str, max: Option<u64>, field: &str) -> Result<usize, Problem> {
    if !AGENT.matches(agent) {
        return Err(Problem::new(Kind::InvalidBody, "agent must be 1 to 200 characters, without control characters")
            .field(format!("{field}agent")));
    }
    let max = max.unwrap_or(TASKS.default);
    if !TASKS.contains(max) {
        return Err(Problem::new(Kind::InvalidBody, format!("max must be from 1 to {}, not {max}", TASKS.max))
            .field(format!("{field}max")));
    }
    Ok(max as usize)
}

/// A report's `next`, checked before the report is applied.
fn checked_next(s: &AppState, caller: &Caller, next: Option<NextTasks>) -> Result<Option<(NextTasks, usize)>, Problem> {
    next.map(|n| lease_args(s, caller, &n.queue, &n.agent, n.max, "next.").map(|max| (n, max))).transpose()
}

/// The tasks a report's `next` asked for, leased now that the report is accepted.
async fn lease_next(s: &AppState, next: Option<(NextTasks, usize)>) -> Result<Option<Vec<Task>>, Problem> {
    let Some((n, max)) = next else { return Ok(None) };
    let tasks = s.engine().agent_lease(&n.queue, &n.agent, max, Duration::ZERO).await?;
    Ok(Some(tasks.into_iter().map(|t| task_json(s, t)).collect()))
}

/// Extends a task's lease by its lock time.
#[utoipa::path(
    post,
    operation_id = "heartbeatTask",
    path = "/v1/tasks/{id}/heartbeat",
    tag = "agents",
    params(TaskPath),
    request_body(content = HeartbeatRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "the lease's new end", body = Extended),
    )
)]
async fn heartbeat(
    State(s): State<AppState>,
    caller: Caller,
    Path(TaskPath { id }): Path<TaskPath>,
    JsonBody(req): JsonBody<HeartbeatRequest>,
) -> Result<Json<Extended>, Problem> {
    let locked_until = s.engine().agent_heartbeat_as(id, &req.token, caller.queues()).await.map_err(refused)?;
    Ok(Json(Extended { locked_until }))
}

fn accepted(report: settle_engine::Report, tasks: Option<Vec<Task>>) -> Response {
    let replayed = report == settle_engine::Report::Replayed;
    let body = Accepted { accepted: true, replayed, tasks };
    (StatusCode::ACCEPTED, [(header::CONTENT_TYPE, "application/json")], Json(body)).into_response()
}

/// Reports a task done with the action's whole outcome: the entity moves to `target` (or
/// stays, to run the action again after `delay_ms`) with `properties` set, creating the
/// entities of `create` and raising the events of `raise`, all in one commit. A report
/// whose target, machines, events or parameters do not fit is refused 422 and changes
/// nothing. With `next`, the answer carries the next tasks leased.
#[utoipa::path(
    post,
    operation_id = "completeTask",
    path = "/v1/tasks/{id}/complete",
    tag = "agents",
    params(TaskPath),
    request_body(content = CompleteRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "accepted: queued durably for the entity", body = Accepted),
    )
)]
async fn complete(
    State(s): State<AppState>,
    caller: Caller,
    Path(TaskPath { id }): Path<TaskPath>,
    JsonBody(mut req): JsonBody<CompleteRequest>,
) -> Result<Response, Problem> {
    let next = checked_next(&s, &caller, req.next.take())?;
    let token = req.token.clone();
    let report = super::report::outcome(req)?;
    let answer = report_complete(&s, &caller, id, &token, report).await?;
    Ok(accepted(answer, lease_next(&s, next).await?))
}

/// Applies a `complete` report of task `id` (its `next` aside), its body read into `report`.
async fn report_complete(
    s: &AppState,
    caller: &Caller,
    id: i64,
    token: &str,
    mut report: super::report::Report,
) -> Result<settle_engine::Report, Problem> {
    // The outcome goes to the engine; the report keeps what maps its fields back.
    let result = TaskResult::Complete(std::mem::take(&mut report.outcome));
    s.engine().agent_report_as(id, token, result, caller.queues()).await.map_err(|e| match e {
        // The engine names the outcome's part at fault; the agent needs the request's.
        settle_engine::Error::Task(TaskRefusal::BadReport { task, field, reason }) => {
            refused(settle_engine::Error::Task(TaskRefusal::BadReport { task, field: report.field(&field), reason }))
        }
        other => refused(other),
    })
}

/// Applies a `fail` report of task `id` (its `next` aside).
async fn report_fail(
    s: &AppState,
    caller: &Caller,
    id: i64,
    req: FailRequest,
) -> Result<settle_engine::Report, Problem> {
    let result = TaskResult::Fail { error: req.error, retryable: req.retryable.unwrap_or(true) };
    s.engine().agent_report_as(id, &req.token, result, caller.queues()).await.map_err(refused)
}

/// Reports a task failed: a fault of the entity, decided by its fault policy. With `next`,
/// the answer carries the next tasks leased.
#[utoipa::path(
    post,
    operation_id = "failTask",
    path = "/v1/tasks/{id}/fail",
    tag = "agents",
    params(TaskPath),
    request_body(content = FailRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "accepted: queued durably for the entity", body = Accepted),
    )
)]
async fn fail(
    State(s): State<AppState>,
    caller: Caller,
    Path(TaskPath { id }): Path<TaskPath>,
    JsonBody(mut req): JsonBody<FailRequest>,
) -> Result<Response, Problem> {
    let next = checked_next(&s, &caller, req.next.take())?;
    let report = report_fail(&s, &caller, id, req).await?;
    Ok(accepted(report, lease_next(&s, next).await?))
}

/// What the document constrains in report `i` of many, checked for the whole request
/// before any report is applied (what it cannot say is refused for that report alone): a
/// `next` of its own (refused later) must still have the shape of one, and a `complete`
/// body its [`shape`](super::report::shape).
fn shape_fits(i: usize, r: &TaskReport) -> Result<(), Problem> {
    let nested = [
        ("complete", r.complete.as_ref().and_then(|c| c.next.as_ref())),
        ("fail", r.fail.as_ref().and_then(|f| f.next.as_ref())),
    ];
    for (part, next) in nested {
        if let Some(n) = next {
            lease_shape(&n.agent, n.max, &format!("reports[{i}].{part}.next."))?;
        }
    }
    match &r.complete {
        Some(c) => super::report::shape(c).map_err(|p| p.within(&format!("reports[{i}].complete"))),
        None => Ok(()),
    }
}

/// Reports many tasks in one request: each report is applied or refused on its own, as its
/// own `complete` or `fail` request would be (a refusal's `field` prefixed with
/// `reports[i].`), all queued together; `next` leases the next tasks once they are handled.
#[utoipa::path(
    post,
    operation_id = "reportTasks",
    path = "/v1/tasks/reports",
    tag = "agents",
    request_body(content = ReportMany, content_type = "application/json"),
    responses(
        (status = 200, description = "what became of each report, in order", body = ReportsHandled),
    )
)]
async fn report_many(
    State(s): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<ReportMany>,
) -> Result<Json<ReportsHandled>, Problem> {
    let n = req.reports.len() as u64;
    if !TASKS.contains(n) {
        return Err(Problem::new(Kind::InvalidBody, format!("reports must hold 1 to {} reports, not {n}", TASKS.max))
            .field("reports"));
    }
    let next = checked_next(&s, &caller, req.next)?;
    // The request counts as its reports against the token's rate limit.
    s.gate().charge(&caller, n - 1);
    // What the document constrains is checked for the whole request first (a report that
    // breaks it refuses the request, nothing applied); the rest for each report.
    for (i, r) in req.reports.iter().enumerate() {
        shape_fits(i, r)?;
    }
    // All at once: the engine's writer queues them in one batch.
    let mut running = tokio::task::JoinSet::new();
    for (i, r) in req.reports.into_iter().enumerate() {
        let (s, caller) = (s.clone(), caller.clone());
        running.spawn(async move {
            let task = r.task;
            let no_next = |at: &str| {
                Problem::new(Kind::InvalidBody, "a report of many takes no `next` of its own: give it beside `reports`")
                    .field(format!("{at}.next"))
            };
            let answer = match (r.complete, r.fail) {
                (Some(c), None) => {
                    let at = format!("reports[{i}].complete");
                    match c.next {
                        Some(_) => Err(no_next(&at)),
                        None => {
                            let token = c.token.clone();
                            match super::report::outcome(c) {
                                Ok(outcome) => report_complete(&s, &caller, task, &token, outcome).await,
                                Err(p) => Err(p),
                            }
                            .map_err(|p| p.within(&at))
                        }
                    }
                }
                (None, Some(f)) => {
                    let at = format!("reports[{i}].fail");
                    match f.next {
                        Some(_) => Err(no_next(&at)),
                        None => report_fail(&s, &caller, task, f).await.map_err(|p| p.within(&at)),
                    }
                }
                _ => Err(Problem::new(Kind::InvalidBody, "give exactly one of `complete` and `fail`")
                    .field(format!("reports[{i}]"))),
            };
            (i, task, answer)
        });
    }
    let mut results = Vec::with_capacity(n as usize);
    while let Some(done) = running.join_next().await {
        let (i, task, answer) = done.map_err(|e| Problem::new(Kind::Internal, format!("a report failed: {e}")))?;
        let result = match answer {
            Ok(report) => ReportResult {
                task,
                accepted: true,
                replayed: report == settle_engine::Report::Replayed,
                problem: None,
            },
            Err(p) => ReportResult {
                task,
                accepted: false,
                replayed: false,
                problem: Some(serde_json::to_value(p.body()).unwrap_or_default()),
            },
        };
        results.push((i, result));
    }
    results.sort_by_key(|(i, _)| *i);
    let results = results.into_iter().map(|(_, r)| r).collect();
    Ok(Json(ReportsHandled { results, tasks: lease_next(&s, next).await? }))
}
