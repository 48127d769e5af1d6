//! settle-client: a typed HTTP client for Settle's management API (`settle serve`), for
//! callers (create entities, raise events, follow operations, operator commands) and for
//! external agents (lease tasks from a queue, heartbeat, report). Other languages use the
//! server's `/openapi.json`.
//!
//! An agent's loop (see `examples/agent.rs` for a whole one):
//!
//! ```no_run
//! # async fn agent() -> Result<(), settle_client::Error> {
//! use std::time::Duration;
//! let client = settle_client::Client::new("http://127.0.0.1:7400")?.with_token("agent-secret");
//! loop {
//!     for task in client.lease("dns", "dns-agent-1", 8, Duration::from_secs(20)).await? {
//!         // ... call the provider, heartbeating if it takes long ...
//!         let properties = serde_json::json!({"record": format!("{}.example", task.key)});
//!         client.complete(&task, "ready", properties).await?;
//!     }
//! }
//! # }
//! ```
//!
//! Errors from the server arrive as [`Error::Problem`]: the problem+json body, with its
//! stable `type` (see [`Problem::kind`]) and status.

mod feed;

use std::time::Duration;

pub use feed::{Change, FeedQuery, FeedStream};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
pub use settle_api::{
    Bulk, BulkDryRun, BulkFilter, BulkRequest, CancelResult, CanceledEntity, CompleteRequest, DeployResult, Deployed,
    Entity, EntityLimit, EntityPage, EventCheck, FailRequest, HistoryEntry, LimitUsage, NextFire, NextTasks, Operation,
    OperationTrace, Outcome, QueuedEvent, Related, ReportCreate, ReportMany, ReportRaise, ReportResult, ReportsHandled,
    Schedule, Task, TaskReport, Verdict, Why, WhyStep,
};
use settle_api::{BulkList, CancelRequest, DeployFile, DeployRequest, Leased, LimitList, OperationList, ScheduleList};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with a problem (application/problem+json).
    #[error("{status}: {} ({})", .problem.detail.as_deref().unwrap_or(&.problem.title), .problem.kind())]
    Problem {
        /// The HTTP status.
        status: u16,
        /// The problem body.
        problem: Box<Problem>,
    },
    /// The server could not be reached, or the connection failed.
    #[error("cannot reach {url}: {source}")]
    Transport {
        /// The URL called.
        url: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not what the API promises.
    #[error("unexpected answer from {url}: {message}")]
    Unexpected {
        /// The URL called.
        url: String,
        /// What was wrong.
        message: String,
    },
    /// The base URL is not an http(s) URL.
    #[error("invalid server URL `{0}` (expected e.g. http://127.0.0.1:7400)")]
    BadUrl(String),
}

impl Error {
    /// The problem type's last segment (`rejected-event`, `task-refused`, ...), if the
    /// server answered with a problem.
    pub fn problem_kind(&self) -> Option<&str> {
        match self {
            Error::Problem { problem, .. } => Some(problem.kind()),
            _ => None,
        }
    }
    /// The HTTP status, if the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Problem { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// An RFC 9457 problem as the server writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Problem {
    /// `https://settle.dev/problems/<kind>`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Short summary of the kind.
    pub title: String,
    /// The status.
    pub status: u16,
    /// What exactly went wrong.
    pub detail: Option<String>,
    /// The offending field, when there is one.
    pub field: Option<String>,
    /// Further members (machine, key, event, state, reason, operation, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Problem {
    /// The last segment of the type URI: a stable, short name of the problem.
    pub fn kind(&self) -> &str {
        self.type_.rsplit('/').next().unwrap_or(&self.type_)
    }
}

/// The answer to [`Client::raise`].
#[derive(Debug, Clone)]
pub enum Raised {
    /// Queued (202): follow `operation` (a path) for the outcome.
    Queued {
        /// The request id.
        request_id: String,
        /// The operation's path (`/v1/operations/{id}`).
        operation: String,
    },
    /// Done (200, [`WaitFor`]): the outcome and the entity afterwards.
    Done {
        /// The request id.
        request_id: String,
        /// The outcome.
        outcome: Option<Outcome>,
        /// The entity afterwards.
        entity: Option<Box<Entity>>,
        /// The operation, ended ([`WaitFor::Operation`] only).
        operation: Option<Box<Operation>>,
    },
}

/// What [`Client::raise`] waits for (the `wait` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// The entity at rest again after the event (`wait=stable`).
    Stable,
    /// The operation the event started ended: every entity it reached at rest
    /// (`wait=operation`).
    Operation,
}

/// Filters of [`Client::list`].
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this machine.
    pub machine: Option<String>,
    /// Only this state.
    pub state: Option<String>,
    /// Only this run status.
    pub status: Option<String>,
    /// Only keys that start with this (the pages are then in machine and key order).
    pub prefix: Option<String>,
    /// The cursor from the previous page.
    pub after: Option<String>,
    /// At most this many.
    pub limit: Option<u32>,
    /// Only entities for which this property expression holds (`where`). With it, `error`
    /// or a time, a page may hold fewer than `limit`: go on while there is a `next`.
    pub expr: Option<String>,
    /// Only entities whose newest error contains this text.
    pub error: Option<String>,
    /// Only entities created at or after this time (RFC 3339, or `-2h`).
    pub created_after: Option<String>,
    /// Only entities created before this time.
    pub created_before: Option<String>,
    /// Only entities that entered their state at or after this time.
    pub entered_after: Option<String>,
    /// Only entities that entered their state before this time.
    pub entered_before: Option<String>,
    /// The order: `id` (default), `entered` (longest in its state first), `-entered`.
    pub sort: Option<String>,
}

/// The error of an answer that is not a success: its problem, or what came instead.
fn refusal(url: String, status: reqwest::StatusCode, bytes: &[u8]) -> Error {
    match serde_json::from_slice::<Problem>(bytes) {
        Ok(problem) => Error::Problem { status: status.as_u16(), problem: Box::new(problem) },
        Err(_) => Error::Unexpected {
            url,
            message: format!("{status}: {}", String::from_utf8_lossy(bytes).chars().take(200).collect::<String>()),
        },
    }
}

/// A client of one Settle server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:7400`).
    pub fn new(base: &str) -> Result<Self, Error> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::BadUrl(base));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::Transport { url: base.clone(), source: e })?;
        Ok(Client { base, token: None, http })
    }

    /// Sends `token` as the bearer token.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<(u16, T), Error> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url).timeout(timeout);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| Error::Transport { url: url.clone(), source: e })?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| Error::Transport { url: url.clone(), source: e })?;
        if !status.is_success() {
            return Err(refusal(url, status, &bytes));
        }
        let value = serde_json::from_slice(&bytes)
            .map_err(|e| Error::Unexpected { url, message: format!("{status}: cannot decode the body: {e}") })?;
        Ok((status.as_u16(), value))
    }

    const TIMEOUT: Duration = Duration::from_secs(30);

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        Ok(self.call(Method::GET, path, None, &[], Self::TIMEOUT).await?.1)
    }

    async fn post<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T, Error> {
        Ok(self.call(Method::POST, path, Some(body), &[], Self::TIMEOUT).await?.1)
    }

    /// Creates an entity; `idempotency_key` makes a retry safe (a replay answers the entity
    /// as it is).
    pub async fn create(
        &self,
        machine: &str,
        key: &str,
        properties: Value,
        idempotency_key: Option<&str>,
    ) -> Result<Entity, Error> {
        let headers: Vec<(&str, &str)> = idempotency_key.map(|k| ("idempotency-key", k)).into_iter().collect();
        let body = json!({"key": key, "properties": properties});
        let path = format!("/v1/machines/{}/entities", seg(machine));
        Ok(self.call(Method::POST, &path, Some(&body), &headers, Self::TIMEOUT).await?.1)
    }

    /// Reads an entity, with the events permitted in its state.
    pub async fn entity(&self, machine: &str, key: &str) -> Result<Entity, Error> {
        self.get(&format!("/v1/machines/{}/entities/{}", seg(machine), seg(key))).await
    }

    /// What `event`, raised now with `params`, would do to the entity: run an action,
    /// be ignored, or be refused and why (guards evaluated). Nothing is written.
    pub async fn check_event(&self, machine: &str, key: &str, event: &str, params: Value) -> Result<EventCheck, Error> {
        let path = format!("/v1/machines/{}/entities/{}/events/{}/check", seg(machine), seg(key), seg(event));
        let (_, v): (u16, Value) = self.call(Method::POST, &path, Some(&params), &[], Self::TIMEOUT).await?;
        serde_json::from_value(v).map_err(|e| Error::Unexpected { url: path, message: e.to_string() })
    }

    /// Lists entities, one page.
    pub async fn list(&self, f: &ListFilter) -> Result<EntityPage, Error> {
        let mut q = Vec::new();
        for (k, v) in [
            ("machine", &f.machine),
            ("state", &f.state),
            ("status", &f.status),
            ("prefix", &f.prefix),
            ("after", &f.after),
            ("where", &f.expr),
            ("error", &f.error),
            ("created_after", &f.created_after),
            ("created_before", &f.created_before),
            ("entered_after", &f.entered_after),
            ("entered_before", &f.entered_before),
            ("sort", &f.sort),
        ] {
            if let Some(v) = v {
                q.push(format!("{k}={}", seg(v)));
            }
        }
        if let Some(l) = f.limit {
            q.push(format!("limit={l}"));
        }
        let query = if q.is_empty() { String::new() } else { format!("?{}", q.join("&")) };
        self.get(&format!("/v1/entities{query}")).await
    }

    /// Every entity matching `f` (follows the pages).
    pub async fn list_all(&self, f: &ListFilter) -> Result<Vec<Entity>, Error> {
        let mut f = f.clone();
        let mut all = Vec::new();
        loop {
            let page = self.list(&f).await?;
            all.extend(page.items);
            match page.next {
                Some(next) => f.after = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// The entity's history, oldest first.
    pub async fn history(&self, machine: &str, key: &str) -> Result<Vec<HistoryEntry>, Error> {
        let path = format!("/v1/machines/{}/entities/{}/history", seg(machine), seg(key));
        let v: Value = self.get(&path).await?;
        // A bare array or `{ "items": [...] }`.
        let items = if v.is_array() { v } else { v.get("items").cloned().unwrap_or(Value::Null) };
        serde_json::from_value(items).map_err(|e| Error::Unexpected { url: path, message: e.to_string() })
    }

    /// Raises `event` with `params`. With `wait` (`Some((what, timeout))`), waits until the
    /// entity is stable again or the whole operation ended (200) — a rejected event is then
    /// an [`Error::Problem`] of kind `event-rejected` (409); without, answers at once with
    /// the operation to follow (202).
    pub async fn raise(
        &self,
        machine: &str,
        key: &str,
        event: &str,
        params: Value,
        wait: Option<(WaitFor, Duration)>,
        idempotency_key: Option<&str>,
    ) -> Result<Raised, Error> {
        self.raise_at(machine, key, event, params, wait, idempotency_key, None).await
    }

    /// [`Client::raise`], with the priority of the work the event starts (-1000 to 1000;
    /// `None`: the event's declared one): work waiting in a limit's line goes by it,
    /// higher first.
    #[allow(clippy::too_many_arguments)]
    pub async fn raise_at(
        &self,
        machine: &str,
        key: &str,
        event: &str,
        params: Value,
        wait: Option<(WaitFor, Duration)>,
        idempotency_key: Option<&str>,
        priority: Option<i64>,
    ) -> Result<Raised, Error> {
        let mut path = format!("/v1/machines/{}/entities/{}/events/{}", seg(machine), seg(key), seg(event));
        let mut query = Vec::new();
        let timeout = match wait {
            Some((what, t)) => {
                let what = match what {
                    WaitFor::Stable => "stable",
                    WaitFor::Operation => "operation",
                };
                query.push(format!("wait={what}&timeout={}ms", t.as_millis()));
                t + Self::TIMEOUT
            }
            None => Self::TIMEOUT,
        };
        if let Some(p) = priority {
            query.push(format!("priority={p}"));
        }
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query.join("&"));
        }
        let headers: Vec<(&str, &str)> = idempotency_key.map(|k| ("idempotency-key", k)).into_iter().collect();
        let (status, v): (u16, Value) = self.call(Method::POST, &path, Some(&params), &headers, timeout).await?;
        let decode = |e: serde_json::Error| Error::Unexpected { url: path.clone(), message: e.to_string() };
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        if status == StatusCode::ACCEPTED.as_u16() {
            return Ok(Raised::Queued { request_id: text("request_id"), operation: text("operation") });
        }
        Ok(Raised::Done {
            request_id: text("request_id"),
            outcome: v
                .get("outcome")
                .filter(|o| !o.is_null())
                .cloned()
                .map(serde_json::from_value)
                .transpose()
                .map_err(decode)?,
            entity: v
                .get("entity")
                .filter(|o| !o.is_null())
                .cloned()
                .map(serde_json::from_value)
                .transpose()
                .map_err(decode)?,
            operation: v
                .get("operation")
                .filter(|o| !o.is_null())
                .cloned()
                .map(serde_json::from_value)
                .transpose()
                .map_err(decode)?,
        })
    }

    /// An operator command: `pause`, `resume`, `kill`, `release`, `retry`, or `sleep` (with
    /// `until`: RFC 3339 UTC or `+10m`).
    pub async fn command(&self, machine: &str, key: &str, command: &str, until: Option<&str>) -> Result<Entity, Error> {
        self.command_with(machine, key, command, until, None).await
    }

    /// [`Client::command`] with an idempotency key: a command repeated with the same key is
    /// done once (a replay answers the entity as it is).
    pub async fn command_with(
        &self,
        machine: &str,
        key: &str,
        command: &str,
        until: Option<&str>,
        idempotency_key: Option<&str>,
    ) -> Result<Entity, Error> {
        self.command_for(machine, key, command, until, idempotency_key, None).await
    }

    /// [`Client::command_with`] with the operator's reason, kept with the operation and in
    /// the entity's history.
    pub async fn command_for(
        &self,
        machine: &str,
        key: &str,
        command: &str,
        until: Option<&str>,
        idempotency_key: Option<&str>,
        reason: Option<&str>,
    ) -> Result<Entity, Error> {
        let mut path = format!("/v1/machines/{}/entities/{}/{}", seg(machine), seg(key), seg(command));
        if let Some(r) = reason {
            path.push_str(&format!("?reason={}", seg(r)));
        }
        let body = until.map(|u| json!({"until": u})).unwrap_or_else(|| json!({}));
        let headers: Vec<(&str, &str)> = idempotency_key.map(|k| ("idempotency-key", k)).into_iter().collect();
        Ok(self.call(Method::POST, &path, Some(&body), &headers, Self::TIMEOUT).await?.1)
    }

    /// One operation.
    pub async fn operation(&self, request_id: &str) -> Result<Operation, Error> {
        self.get(&format!("/v1/operations/{}", seg(request_id))).await
    }

    /// What the operation of `request_id` touched: its entities and their transitions.
    pub async fn operation_trace(&self, request_id: &str) -> Result<OperationTrace, Error> {
        self.get(&format!("/v1/operations/{}/trace", seg(request_id))).await
    }

    /// An entity's predecessors and successors, and how far its subscriptions are from
    /// firing.
    pub async fn related(&self, machine: &str, key: &str) -> Result<Related, Error> {
        self.get(&format!("/v1/machines/{}/entities/{}/related", seg(machine), seg(key))).await
    }

    /// A bulk operation's dry run: how many entities its filter matches now, and a sample
    /// (`POST /v1/bulk` with `dry_run`). Nothing is done.
    pub async fn bulk_dry_run(&self, request: &BulkRequest) -> Result<BulkDryRun, Error> {
        let body = serde_json::to_value(BulkRequest { dry_run: true, ..request.clone() }).unwrap_or_default();
        self.post("/v1/bulk", &body).await
    }

    /// Starts a bulk operation (`POST /v1/bulk`), with `idempotency_key` as its request id
    /// when given (the same key again answers that operation).
    pub async fn bulk_start(&self, request: &BulkRequest, idempotency_key: Option<&str>) -> Result<Bulk, Error> {
        let body = serde_json::to_value(BulkRequest { dry_run: false, ..request.clone() }).unwrap_or_default();
        let headers: Vec<(&str, &str)> = idempotency_key.map(|k| ("idempotency-key", k)).into_iter().collect();
        Ok(self.call(Method::POST, "/v1/bulk", Some(&body), &headers, Self::TIMEOUT).await?.1)
    }

    /// One bulk operation and its progress.
    pub async fn bulk(&self, request_id: &str) -> Result<Bulk, Error> {
        self.get(&format!("/v1/bulk/{}", seg(request_id))).await
    }

    /// The newest bulk operations, newest first.
    pub async fn bulk_list(&self) -> Result<Vec<Bulk>, Error> {
        Ok(self.get::<BulkList>("/v1/bulk").await?.items)
    }

    /// Cancels a running bulk operation; the operation afterwards.
    pub async fn bulk_cancel(&self, request_id: &str) -> Result<Bulk, Error> {
        self.post(&format!("/v1/bulk/{}/cancel", seg(request_id)), &json!({})).await
    }

    /// Cancels the operation `request_id` (`POST /v1/operations/{id}/cancel`): every entity
    /// it reached stops its work in it and runs its machine's cancel event where there is
    /// one. Answers once every entity's work has stopped (with `undone`, once every undo
    /// ended too), or after 30 s with the cancel so far (it goes on). Asking again answers
    /// the same cancel.
    pub async fn cancel_operation(
        &self,
        request_id: &str,
        reason: Option<&str>,
        undone: bool,
    ) -> Result<CancelResult, Error> {
        let body = CancelRequest { reason: reason.map(str::to_string), undone };
        let body = serde_json::to_value(body).unwrap_or_default();
        self.post(&format!("/v1/operations/{}/cancel", seg(request_id)), &body).await
    }

    /// Each concurrency limit's key values with slots in use or work waiting
    /// (`GET /v1/limits`).
    pub async fn limits(&self) -> Result<Vec<LimitUsage>, Error> {
        Ok(self.get::<LimitList>("/v1/limits").await?.items)
    }

    /// Every calendar schedule of the served machines, with its progress.
    pub async fn schedules(&self) -> Result<Vec<Schedule>, Error> {
        Ok(self.get::<ScheduleList>("/v1/schedules").await?.items)
    }

    /// Pauses (`true`) or resumes a schedule; the schedule afterwards.
    pub async fn schedule_pause(&self, machine: &str, name: &str, paused: bool) -> Result<Schedule, Error> {
        let verb = if paused { "pause" } else { "resume" };
        self.post(&format!("/v1/schedules/{}/{}/{verb}", seg(machine), seg(name)), &json!({})).await
    }

    /// Deploys new versions of machines (`POST /v1/machines`, admin): `files` are
    /// `(file name, TOML text)`; with `dry_run`, answers what would happen.
    pub async fn deploy(&self, files: Vec<(String, String)>, dry_run: bool) -> Result<DeployResult, Error> {
        let files = files.into_iter().map(|(name, toml)| DeployFile { name, toml }).collect();
        let body = serde_json::to_value(DeployRequest { files, dry_run }).unwrap_or_default();
        self.post("/v1/machines", &body).await
    }

    /// Why the entity failed, down to the first cause (`GET …/why`).
    pub async fn why(&self, machine: &str, key: &str) -> Result<Why, Error> {
        self.get(&format!("/v1/machines/{}/entities/{}/why", seg(machine), seg(key))).await
    }

    /// Operations, newest first (`outcome`: only those; `open`: unfinished).
    pub async fn operations(&self, outcome: Option<&str>, limit: u64) -> Result<Vec<Operation>, Error> {
        let mut path = format!("/v1/operations?limit={limit}");
        if let Some(o) = outcome {
            path.push_str(&format!("&outcome={}", seg(o)));
        }
        Ok(self.get::<OperationList>(&path).await?.items)
    }

    /// Leases up to `max` tasks from `queue` as `agent`, waiting up to `wait` for one (a
    /// long poll; the server caps it). An empty answer means none came.
    pub async fn lease(&self, queue: &str, agent: &str, max: u32, wait: Duration) -> Result<Vec<Task>, Error> {
        let body = json!({"agent": agent, "max": max, "wait_ms": wait.as_millis() as u64});
        let path = format!("/v1/queues/{}/lease", seg(queue));
        let (_, tasks): (u16, Leased) = self.call(Method::POST, &path, Some(&body), &[], wait + Self::TIMEOUT).await?;
        Ok(tasks.tasks)
    }

    /// Extends the lease on `task` by its lock time; answers the new `locked_until`. Fails
    /// with kind `task-refused` (409) once the lease is lost: stop working on it.
    pub async fn heartbeat(&self, task: &Task) -> Result<i64, Error> {
        let v: Value = self.post(&format!("/v1/tasks/{}/heartbeat", task.id), &json!({"token": task.token})).await?;
        v.get("locked_until")
            .and_then(Value::as_i64)
            .ok_or_else(|| Error::Unexpected { url: "heartbeat".into(), message: format!("no locked_until in {v}") })
    }

    /// Reports success: the entity moves to `target` with `properties` set (`null` removes
    /// one). Refused (409 `task-refused`) after the lease expired or was superseded.
    pub async fn complete(&self, task: &Task, target: &str, properties: Value) -> Result<(), Error> {
        let body = json!({"token": task.token, "target": target, "properties": properties});
        self.post::<Value>(&format!("/v1/tasks/{}/complete", task.id), &body).await.map(|_| ())
    }

    /// Reports success with the action's whole outcome (the request's `token` is set from
    /// `task`): a target or a retry with `delay_ms`, property changes, entities to create
    /// and events to raise, all committed with the transition. Refused 422
    /// (`invalid-report`, naming the field) when it does not fit the action or the
    /// machines, and 409 `task-refused` after the lease expired or was superseded.
    ///
    /// ```no_run
    /// # async fn f(client: settle_client::Client, task: settle_client::Task) -> Result<(), settle_client::Error> {
    /// use settle_client::{CompleteRequest, ReportCreate};
    /// let outcome = CompleteRequest {
    ///     target: Some("awaiting_resources".into()),
    ///     create: vec![ReportCreate {
    ///         machine: "app".into(),
    ///         key: format!("{}-app", task.key),
    ///         properties: None,
    ///         event: None,
    ///         params: None,
    ///         reply: None,
    ///     }],
    ///     ..CompleteRequest::default()
    /// };
    /// client.report(&task, outcome).await?;
    /// # Ok(()) }
    /// ```
    pub async fn report(&self, task: &Task, outcome: CompleteRequest) -> Result<(), Error> {
        let body = CompleteRequest { token: task.token.clone(), ..outcome };
        let body = serde_json::to_value(&body)
            .map_err(|e| Error::Unexpected { url: "complete".into(), message: e.to_string() })?;
        self.post::<Value>(&format!("/v1/tasks/{}/complete", task.id), &body).await.map(|_| ())
    }

    /// Sends many reports in one request (`POST /v1/tasks/reports`), each applied or refused
    /// on its own, and with `next`, leases the next tasks once they are handled: what became
    /// of each report, in order, and the tasks leased.
    pub async fn report_many(
        &self,
        reports: Vec<TaskReport>,
        next: Option<NextTasks>,
    ) -> Result<ReportsHandled, Error> {
        let body = serde_json::to_value(ReportMany { reports, next })
            .map_err(|e| Error::Unexpected { url: "reports".into(), message: e.to_string() })?;
        self.post("/v1/tasks/reports", &body).await
    }

    /// Reports failure: a fault of the entity, retried by its fault policy when
    /// `retryable`, parked for an operator otherwise.
    pub async fn fail(&self, task: &Task, error: &str, retryable: bool) -> Result<(), Error> {
        let body = json!({"token": task.token, "error": error, "retryable": retryable});
        self.post::<Value>(&format!("/v1/tasks/{}/fail", task.id), &body).await.map(|_| ())
    }
}

/// Percent-encodes a path segment or query value (keys are user data).
fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(seg("a b/c?d"), "a%20b%2Fc%3Fd");
        assert_eq!(seg("ok-1_2.3~"), "ok-1_2.3~");
        assert_eq!(seg("é"), "%C3%A9");
    }

    #[test]
    fn urls_must_be_http() {
        assert!(matches!(Client::new("127.0.0.1:7400"), Err(Error::BadUrl(_))));
        assert_eq!(Client::new("http://127.0.0.1:7400/").unwrap().base(), "http://127.0.0.1:7400");
    }

    #[test]
    fn problems_decode_with_their_kind() {
        let p: Problem = serde_json::from_value(json!({
            "type": "https://settle.dev/problems/task-refused", "title": "task refused", "status": 409,
            "detail": "task 3: already reported", "task": 3
        }))
        .unwrap();
        assert_eq!((p.kind(), p.extra.get("task")), ("task-refused", Some(&json!(3))));
    }
}
