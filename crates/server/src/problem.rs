//! The one error type of the HTTP API: [`Problem`], answered as `application/problem+json`
//! (RFC 9457) with a stable `type` URI per kind of problem ([`Kind`]).
//!
//! Every failure a handler, an extractor or the auth layer can meet becomes a `Problem`;
//! axum's own rejections are translated in [`crate::extract`], unknown routes and methods
//! in [`crate::router`](mod@crate::router). Server-side failures are logged once, here, at the edge.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};
use settle_core::RaiseError;
use utoipa::ToSchema;

/// Where problem types live: `type` is this followed by the kind's slug.
pub const TYPE_BASE: &str = "https://settle.dev/problems/";

/// The media type of problem documents.
pub const CONTENT_TYPE: &str = "application/problem+json";

macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident => ($status:ident, $slug:literal, $title:literal),)*) => {
        /// The kinds of problem: each has one status, slug (`type` is
        /// `https://settle.dev/problems/<slug>`) and title.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Kind {
            $($(#[$doc])* $variant,)*
        }

        impl Kind {
            /// Every kind, for documentation and tests.
            pub const ALL: &'static [Kind] = &[$(Kind::$variant,)*];
            /// The HTTP status.
            pub fn status(self) -> StatusCode {
                match self { $(Kind::$variant => StatusCode::$status,)* }
            }
            /// The stable slug of the `type` URI.
            pub fn slug(self) -> &'static str {
                match self { $(Kind::$variant => $slug,)* }
            }
            /// The short, fixed summary.
            pub fn title(self) -> &'static str {
                match self { $(Kind::$variant => $title,)* }
            }
        }
    };
}

kinds! {
    /// The body is not JSON (syntax error, truncated).
    MalformedJson => (BAD_REQUEST, "malformed-json", "malformed JSON body"),
    /// A query parameter, path segment or header is not what the route accepts.
    BadRequest => (BAD_REQUEST, "bad-request", "bad request"),
    /// No token, or a token that is not configured.
    Unauthorized => (UNAUTHORIZED, "unauthorized", "missing or unknown bearer token"),
    /// The token's role may not do this.
    Forbidden => (FORBIDDEN, "forbidden", "role not allowed"),
    /// No such route.
    UnknownRoute => (NOT_FOUND, "unknown-route", "no such route"),
    /// No machine of that name is served.
    UnknownMachine => (NOT_FOUND, "unknown-machine", "unknown machine"),
    /// No entity with that machine and key.
    UnknownEntity => (NOT_FOUND, "unknown-entity", "unknown entity"),
    /// The machine declares no such event.
    UnknownEvent => (NOT_FOUND, "unknown-event", "unknown event"),
    /// No operation with that request id.
    UnknownOperation => (NOT_FOUND, "unknown-operation", "unknown operation"),
    /// No bulk operation with that request id.
    UnknownBulk => (NOT_FOUND, "unknown-bulk", "unknown bulk operation"),
    /// The machine declares no schedule of that name.
    UnknownSchedule => (NOT_FOUND, "unknown-schedule", "unknown schedule"),
    /// A bulk operation that cannot run as asked (no criterion, an unknown machine, state,
    /// status or event, no reason, a rate out of range); `field` names the part.
    InvalidBulk => (UNPROCESSABLE_ENTITY, "invalid-bulk", "invalid bulk operation"),
    /// A machine definition that does not load or validate (TOML, references between
    /// machines, an action with no handler here); `field` names the file; nothing changed.
    InvalidDefinition => (UNPROCESSABLE_ENTITY, "invalid-definition", "invalid machine definition"),
    /// A new version would leave live entities in (or, pinned, coming to rest in) a state
    /// it has no home for; `stranded` lists them; nothing changed.
    VersionStrandsEntities => (CONFLICT, "version-strands-entities", "version would strand live entities"),
    /// The operation to cancel has ended: nothing of it is left to stop; nothing changed.
    OperationEnded => (CONFLICT, "operation-ended", "operation ended"),
    /// The route exists, the method does not.
    MethodNotAllowed => (METHOD_NOT_ALLOWED, "method-not-allowed", "method not allowed"),
    /// The event is not valid in the entity's state; nothing changed.
    EventRejected => (CONFLICT, "event-rejected", "event rejected"),
    /// An entity with that key exists already.
    EntityExists => (CONFLICT, "entity-exists", "entity already exists"),
    /// The `Idempotency-Key` was used before for another request (another entity, event or
    /// route); nothing changed.
    KeyReused => (CONFLICT, "idempotency-key-reused", "idempotency key used for another request"),
    /// The entity was killed: it takes nothing but `kill`.
    EntityKilled => (CONFLICT, "entity-killed", "entity killed"),
    /// The entity is in its machine's deleted state: gone for users.
    EntityDeleted => (GONE, "entity-deleted", "entity deleted"),
    /// The body is larger than the server accepts.
    BodyTooLarge => (PAYLOAD_TOO_LARGE, "body-too-large", "request body too large"),
    /// The body is not `application/json`, or a request that can change something does not
    /// say `Content-Type: application/json` (nor carry a bearer token).
    UnsupportedMediaType => (UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type", "body must be application/json"),
    /// JSON of the wrong shape: a missing or mistyped field.
    InvalidBody => (UNPROCESSABLE_ENTITY, "invalid-body", "invalid request body"),
    /// Event parameters that do not match the event's declaration.
    InvalidParameters => (UNPROCESSABLE_ENTITY, "invalid-parameters", "invalid event parameters"),
    /// Entity properties that are not an object or break the initial state's invariant.
    InvalidProperties => (UNPROCESSABLE_ENTITY, "invalid-properties", "invalid entity properties"),
    /// An entity key that is empty, too long or has control characters.
    InvalidKey => (UNPROCESSABLE_ENTITY, "invalid-key", "invalid entity key"),
    /// The event was valid but its action failed (error, refused outcome); nothing changed.
    EventFailed => (UNPROCESSABLE_ENTITY, "event-failed", "event failed"),
    /// A server-side failure (store error); logged.
    Internal => (INTERNAL_SERVER_ERROR, "internal", "internal error"),
    /// The engine is shutting down.
    Unavailable => (SERVICE_UNAVAILABLE, "unavailable", "engine stopped"),
    /// The response had not started within the server's request timeout (what the request
    /// asked for may still happen: follow its operation).
    RequestTimeout => (SERVICE_UNAVAILABLE, "request-timeout", "request took longer than the server allows"),
    /// `wait=stable` ran out; the request is durable and is still processed.
    WaitTimeout => (GATEWAY_TIMEOUT, "wait-timeout", "timed out waiting; the request is still processed"),
    /// No action of any served machine is bound to that agent queue.
    UnknownQueue => (NOT_FOUND, "unknown-queue", "unknown agent queue"),
    /// No agent task with that id.
    UnknownTask => (NOT_FOUND, "unknown-task", "unknown task"),
    /// An agent's heartbeat or report without the live lease (expired or superseded), or on
    /// a task canceled or reported by another lease; nothing changed.
    TaskRefused => (CONFLICT, "task-refused", "task lease not held"),
    /// An agent's report that does not fit the task's action (an undeclared target).
    InvalidReport => (UNPROCESSABLE_ENTITY, "invalid-report", "invalid agent report"),
    /// Too many long polls are waiting on this server; retry shortly.
    TooManyPolls => (TOO_MANY_REQUESTS, "too-many-polls", "too many long polls waiting"),
    /// The token made more requests per second than `--rate-limit` allows; retry after
    /// `Retry-After` seconds (also the member `retry_after`).
    RateLimited => (TOO_MANY_REQUESTS, "rate-limited", "rate limit exceeded"),
    /// The client's address presented too many unknown tokens; every request of it that
    /// presents a token is refused until `Retry-After` seconds (also `retry_after`) pass.
    AuthThrottled => (TOO_MANY_REQUESTS, "auth-throttled", "too many failed authentications"),
    /// The `Host` header names neither this server nor a host it was told to answer (DNS
    /// rebinding); see `--allowed-host`.
    HostNotAllowed => (FORBIDDEN, "host-not-allowed", "host not allowed"),
    /// The request comes from a page of another origin (`Origin`, or a browser's
    /// `Sec-Fetch-Site`); see `--allowed-origin`.
    OriginNotAllowed => (FORBIDDEN, "origin-not-allowed", "origin not allowed"),
    /// Evaluating a filter (`where`, `error`) over a page took longer than the server
    /// allows (`--filter-budget`); narrow it by an index criterion or simplify it.
    FilterTooCostly => (UNPROCESSABLE_ENTITY, "filter-too-costly", "filter too costly"),
    /// Too many change-feed streams are open: for this token, or on the server; retry after
    /// `Retry-After` seconds.
    TooManyStreams => (TOO_MANY_REQUESTS, "too-many-streams", "too many feed streams open"),
}

/// A problem document (RFC 9457): status, stable `type`, `title`, `detail`, the offending
/// `field` when there is one, and context members (machine, key, event, state, ...).
///
/// Boxed: handlers return `Result<_, Problem>` everywhere, and the error path is the rare one.
#[derive(Debug, Clone)]
pub struct Problem(Box<Parts>);

#[derive(Debug, Clone)]
struct Parts {
    kind: Kind,
    detail: String,
    field: Option<String>,
    context: Map<String, Value>,
}

/// The problem document as served (for the OpenAPI schema; context members are extra
/// properties).
#[derive(Debug, Serialize, ToSchema)]
pub struct ProblemBody {
    /// `https://settle.dev/problems/<slug>`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Short summary of the kind of problem.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What went wrong in this case, lowercase.
    pub detail: String,
    /// The request field (body member, query parameter, header) at fault, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Context: machine, key, event, state, reason, operation, ...
    #[serde(flatten)]
    pub context: Map<String, Value>,
}

impl Problem {
    /// A problem of `kind` with `detail`.
    pub fn new(kind: Kind, detail: impl Into<String>) -> Self {
        Problem(Box::new(Parts { kind, detail: detail.into(), field: None, context: Map::new() }))
    }
    /// Names the request field at fault.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.0.field = Some(field.into());
        self
    }
    /// The problem of a part of a larger request at `at` (`reports[2]`): its field, if any,
    /// becomes `at.field`, else `at`.
    pub fn within(mut self, at: &str) -> Self {
        self.0.field = Some(match self.0.field.take() {
            Some(f) => format!("{at}.{f}"),
            None => at.to_string(),
        });
        self
    }
    /// Adds a context member.
    pub fn with(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.0.context.insert(name.to_string(), value.into());
        self
    }
    /// The kind.
    pub fn kind(&self) -> Kind {
        self.0.kind
    }
    /// The detail text.
    pub fn detail(&self) -> &str {
        &self.0.detail
    }
    /// The body as served.
    pub fn body(&self) -> ProblemBody {
        ProblemBody {
            type_: format!("{TYPE_BASE}{}", self.0.kind.slug()),
            title: self.0.kind.title().to_string(),
            status: self.0.kind.status().as_u16(),
            detail: self.0.detail.clone(),
            field: self.0.field.clone(),
            context: self.0.context.clone(),
        }
    }

    /// No machine `machine` is served.
    pub fn unknown_machine(machine: &str) -> Self {
        Problem::new(Kind::UnknownMachine, format!("unknown machine `{machine}`")).with("machine", machine)
    }
    /// Over the rate limit of `rate` requests per second: retry in `retry_after` seconds.
    pub fn rate_limited(rate: u32, retry_after: u64) -> Self {
        Problem::new(
            Kind::RateLimited,
            format!("more than {rate} requests per second with this token; retry in {retry_after}s"),
        )
        .with("retry_after", retry_after)
    }
    /// The client's address has no failed authentication left (`per_minute` allowed):
    /// retry in `retry_after` seconds.
    pub fn auth_throttled(per_minute: u32, retry_after: u64) -> Self {
        Problem::new(
            Kind::AuthThrottled,
            format!(
                "too many unknown tokens from this address (more than {per_minute} a minute); \
                 requests with a token are refused for {retry_after}s"
            ),
        )
        .with("retry_after", retry_after)
    }
    /// No entity `key` of `machine`.
    pub fn unknown_entity(machine: &str, key: &str) -> Self {
        Problem::new(Kind::UnknownEntity, format!("no entity `{key}` of machine `{machine}`"))
            .with("machine", machine)
            .with("key", key)
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.0.kind.slug(), self.0.kind.status().as_u16(), self.0.detail)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let (kind, status) = (self.0.kind, self.0.kind.status());
        if status.is_server_error() {
            tracing::error!(kind = kind.slug(), detail = %self.0.detail, "request failed");
        } else {
            tracing::debug!(kind = kind.slug(), detail = %self.0.detail, "request refused");
        }
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        if kind == Kind::Unauthorized {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            let seconds = self.0.context.get("retry_after").and_then(Value::as_u64).unwrap_or(1).max(1);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<settle_engine::Error> for Problem {
    fn from(e: settle_engine::Error) -> Self {
        use settle_engine::Error as E;
        match e {
            E::UnknownMachine(m) => Problem::unknown_machine(&m),
            E::NotFound { machine, key } => Problem::unknown_entity(&machine, &key),
            E::AlreadyExists { machine, key } => {
                Problem::new(Kind::EntityExists, format!("entity `{key}` of machine `{machine}` already exists"))
                    .field("key")
                    .with("machine", machine)
                    .with("key", key)
            }
            E::Killed { machine, key } => Problem::new(
                Kind::EntityKilled,
                format!("entity `{key}` of machine `{machine}` was killed; it takes nothing but kill"),
            )
            .with("machine", machine)
            .with("key", key),
            E::Raise(r) => r.into(),
            E::KeyReused { request_id, used_for, entity } => Problem::new(
                Kind::KeyReused,
                format!("Idempotency-Key `{request_id}` was used before for `{used_for}` on `{entity}`"),
            )
            .field("Idempotency-Key")
            .with("request_id", request_id)
            .with("used_for", used_for)
            .with("entity", entity),
            E::Refused(r) => {
                let mut p = Problem::new(Kind::InvalidProperties, r.to_string()).field("properties");
                if let settle_core::Refusal::InvariantViolated { machine, state, missing } = &r {
                    p = p
                        .with("machine", machine.as_str())
                        .with("state", state.as_str())
                        .with("missing", missing.clone());
                    if let Some(first) = missing.first() {
                        p.0.field = Some(format!("properties.{first}"));
                    }
                }
                p
            }
            E::Timeout { request_id, waited } => Problem::new(
                Kind::WaitTimeout,
                format!("no outcome within {waited:?}; request {request_id} is durable and still processed"),
            )
            .with("request_id", request_id.clone())
            .with("operation", crate::operation_location(&request_id)),
            E::Stopped => Problem::new(Kind::Unavailable, "the engine is shutting down"),
            E::UnknownOperation(id) => {
                Problem::new(Kind::UnknownOperation, format!("no operation with request id `{id}`"))
                    .with("request_id", id)
            }
            E::OperationEnded { request_id, outcome } => Problem::new(
                Kind::OperationEnded,
                format!("operation `{request_id}` has ended ({outcome}): nothing of it is left to cancel"),
            )
            .with("request_id", request_id)
            .with("outcome", outcome),
            E::UnknownSchedule { machine, name } => {
                Problem::new(Kind::UnknownSchedule, format!("machine `{machine}` has no schedule `{name}`"))
                    .with("machine", machine)
                    .with("name", name)
            }
            E::Bulk(message) => {
                const CRITERIA: [&str; 5] = ["machine", "state", "status", "prefix", "health"];
                let field = message.split_once(':').map(|(f, _)| f).filter(|f| {
                    CRITERIA.contains(f)
                        || settle_engine::NARROW_FIELDS.contains(f)
                        || ["reason", "rate", "event", "params", "action"].contains(f)
                });
                let field = match field {
                    Some(f) if CRITERIA.contains(&f) || settle_engine::NARROW_FIELDS.contains(&f) => {
                        Some(format!("filter.{f}"))
                    }
                    Some(f) => Some(f.to_string()),
                    // No criterion at all: the filter is at fault.
                    None => Some("filter".to_string()),
                };
                let mut p = Problem::new(Kind::InvalidBulk, message);
                p.0.field = field;
                p
            }
            E::UpgradeRefused { message, stranded } => {
                let list: Vec<settle_api::Stranded> = stranded
                    .into_iter()
                    .map(|s| settle_api::Stranded {
                        machine: s.machine,
                        state: s.state,
                        rest: s.rest,
                        count: s.count,
                        keys: s.keys,
                    })
                    .collect();
                Problem::new(Kind::VersionStrandsEntities, message)
                    .with("stranded", serde_json::to_value(list).unwrap_or_default())
            }
            E::Invalid(report) => Problem::new(Kind::InvalidDefinition, report.to_string().trim_end().to_string()),
            e @ (E::MissingHandlers(_) | E::Unsupported { .. } | E::UnknownAction { .. } | E::NoArchive(_)) => {
                Problem::new(Kind::InvalidDefinition, e.to_string())
            }
            E::TooLarge { field, reason } => {
                Problem::new(Kind::InvalidProperties, format!("{field}: {reason}")).field(field)
            }
            e @ E::TooCostly { .. } => Problem::new(Kind::FilterTooCostly, e.to_string()).field("where"),
            other => Problem::new(Kind::Internal, other.to_string()),
        }
    }
}

impl From<RaiseError> for Problem {
    fn from(e: RaiseError) -> Self {
        let detail = e.to_string();
        match e {
            RaiseError::UnknownEvent { machine, event } => {
                Problem::new(Kind::UnknownEvent, detail).with("machine", machine.as_str()).with("event", event)
            }
            RaiseError::ParamsNotObject { machine, event } => Problem::new(Kind::InvalidParameters, detail)
                .with("machine", machine.as_str())
                .with("event", event.as_str()),
            RaiseError::MissingParam { machine, event, param } => Problem::new(Kind::InvalidParameters, detail)
                .field(param)
                .with("machine", machine.as_str())
                .with("event", event.as_str()),
            RaiseError::UnknownParam { machine, event, param, .. } => Problem::new(Kind::InvalidParameters, detail)
                .field(param)
                .with("machine", machine.as_str())
                .with("event", event.as_str()),
            RaiseError::Priority { machine, event, .. } => Problem::new(Kind::BadRequest, detail)
                .field("priority")
                .with("machine", machine.as_str())
                .with("event", event.as_str()),
        }
    }
}

impl From<settle_store::Error> for Problem {
    fn from(e: settle_store::Error) -> Self {
        Problem::new(Kind::Internal, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_distinct_slug_and_an_error_status() {
        let mut slugs = std::collections::HashSet::new();
        for k in Kind::ALL {
            assert!(slugs.insert(k.slug()), "duplicate slug {}", k.slug());
            assert!(k.status().is_client_error() || k.status().is_server_error(), "{k:?}");
            assert!(k.slug().bytes().all(|b| b.is_ascii_lowercase() || b == b'-'), "{k:?}");
        }
    }

    #[test]
    fn problem_body_carries_type_field_and_context() {
        let p = Problem::new(Kind::InvalidParameters, "x").field("region").with("machine", "server");
        let v = serde_json::to_value(p.body()).unwrap();
        assert_eq!(v["type"], "https://settle.dev/problems/invalid-parameters");
        assert_eq!(v["status"], 422);
        assert_eq!(v["field"], "region");
        assert_eq!(v["machine"], "server");
        let r = p.into_response();
        assert_eq!(r.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
    }
}
