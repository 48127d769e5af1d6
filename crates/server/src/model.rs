//! The API's JSON types: the bodies are `settle-api`'s (shared with `settle-client`, so
//! server and client cannot drift apart), re-exported here; the query parameters and the
//! engine-to-API conversions are the server's own.

use serde::Deserialize;
use settle_engine::EventOutcome;
use utoipa::IntoParams;

pub use settle_api::*;

/// The API's outcome of an event.
pub fn outcome_of(o: &EventOutcome) -> Outcome {
    match o {
        EventOutcome::Accepted { state } => Outcome::Accepted { state: state.to_string() },
        EventOutcome::Rejected { state, reason } => {
            Outcome::Rejected { state: state.to_string(), reason: reason.clone() }
        }
        EventOutcome::Ignored { state } => Outcome::Ignored { state: state.to_string() },
        EventOutcome::Failed { error } => Outcome::Failed { error: error.clone() },
    }
}

/// An engine's subscription progress as the API shows it.
pub fn subscription_progress_of(p: settle_engine::SubscriptionProgress) -> SubscriptionProgress {
    SubscriptionProgress {
        event: p.event.to_string(),
        pattern: p.pattern,
        selected: p.progress.selected,
        satisfying: p.progress.satisfying,
        holds: p.progress.holds,
        fired: p.fired,
    }
}

/// The API's verdict on an event (see `Engine::can_fire`).
pub fn verdict_of(p: &settle_core::Permission) -> Verdict {
    match p {
        settle_core::Permission::Fires { action, internal } => {
            Verdict::Fires { action: action.to_string(), internal: *internal }
        }
        settle_core::Permission::Ignored { level } => Verdict::Ignored { state: level.to_string() },
        settle_core::Permission::Refused { reason } => Verdict::Refused { reason: reason.clone() },
    }
}

/// Query of `GET /v1/entities`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EntityQuery {
    /// Only this machine.
    pub machine: Option<String>,
    /// Only this state.
    pub state: Option<String>,
    /// Only this run status: active, paused, sleeping, fault, failed, killed.
    pub status: Option<String>,
    /// Only entities in states of this health: `error` (declared `health = "error"`: the
    /// failing ones) or `ok`, by the served machines' definitions.
    pub health: Option<String>,
    /// Only entities whose key starts with this; the page is then ordered by machine and
    /// key (byte-wise) instead of by id.
    pub prefix: Option<String>,
    /// The cursor: `next` of the previous page.
    pub after: Option<String>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<String>,
    /// `true`: say how many match in all (`total`), exact up to 10,000.
    pub total: Option<bool>,
    /// `latest`: each entity with its newest recorded error (`last_error`).
    pub errors: Option<String>,
    /// The order: `id` (the default), `entered` (longest in its state first) or
    /// `-entered` (newest in its state first), read through the (machine, state, entered
    /// time) index; not with `prefix` or `status`.
    pub sort: Option<String>,
    /// Only entities for which this property expression holds (the guards' language:
    /// `props.region == "eu"`). With this, `error` or a time range, a page examines at
    /// most 1,000 entities of the other filters and may hold fewer than `limit`: go on
    /// with `next` while there is one.
    #[serde(rename = "where")]
    #[param(rename = "where")]
    pub expr: Option<String>,
    /// Only entities whose newest error contains this text (ignoring case).
    pub error: Option<String>,
    /// Only entities created at or after this time: RFC 3339, or `-2h` (that long ago).
    pub created_after: Option<String>,
    /// Only entities created before this time.
    pub created_before: Option<String>,
    /// Only entities that entered their state at or after this time.
    pub entered_after: Option<String>,
    /// Only entities that entered their state before this time (`-1h`: in it for more
    /// than an hour).
    pub entered_before: Option<String>,
}

/// Query of `GET /v1/entities/error-groups`: the list's index filters.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ErrorGroupQuery {
    /// Only this machine.
    pub machine: Option<String>,
    /// Only this state.
    pub state: Option<String>,
    /// Only this run status: active, paused, sleeping, fault, failed, killed.
    pub status: Option<String>,
    /// Only entities in states of this health: `error` or `ok`.
    pub health: Option<String>,
    /// Only entities whose key starts with this.
    pub prefix: Option<String>,
}

/// Query of the operator commands (`POST …/pause` and the others).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CommandQuery {
    /// Why: kept with the operation (its dimension `reason`) and in the entity's history.
    pub reason: Option<String>,
}

/// Query of `GET /v1/overview`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OverviewQuery {
    /// How far back the per-minute rates go: a duration (default `1h`), brought within
    /// `1m` to `24h`.
    pub window: Option<String>,
}

/// Query of `GET /v1/operations`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OperationQuery {
    /// Only this outcome: success, failed, canceled, hung, or open (not finished).
    pub outcome: Option<String>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<String>,
    /// The cursor: `next` of the previous page (older operations follow).
    pub before: Option<String>,
    /// Only operations started on an entity of this machine.
    pub machine: Option<String>,
    /// Only operations of this name (`vm.create`, `vm.go`, `vm.pause`, …).
    pub name: Option<String>,
    /// Only operations started at or after this time: RFC 3339, or `-2h` (that long ago).
    pub started_after: Option<String>,
    /// Only operations started before this time.
    pub started_before: Option<String>,
}

/// Query of `POST .../events/{event}`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RaiseQuery {
    /// `stable`: answer 200 once the entity is at rest again (or the event was rejected or
    /// failed). `operation`: answer 200 once the operation the event started has ended,
    /// every entity it reached at rest (children, parents, agents' tasks); the body holds
    /// the operation. Absent: answer 202 once the event is durably queued.
    pub wait: Option<String>,
    /// How long to wait with `wait` (e.g. `30s`; default 30s, at most the server's
    /// `--max-wait`; without `wait` it bounds nothing).
    pub timeout: Option<String>,
    /// The priority of the work the event starts, from -1000 to 1000 (default: the event's
    /// declared priority, else 0): work waiting in a limit's line goes by it, higher first.
    pub priority: Option<i64>,
}

/// Query of `GET .../graph`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GraphQuery {
    /// `mermaid` (default), `dot` or `svg`.
    pub format: Option<String>,
    /// A stored version of the definition (its hash, as `/versions` lists them; an
    /// entity's `machine_version`): its diagram instead of the current one's.
    pub version: Option<String>,
}

/// Query of `GET /v1/feed`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FeedQuery {
    /// Only changes of this machine's entities (and operations on them).
    pub machine: Option<String>,
    /// Only this entity (with `machine`).
    pub key: Option<String>,
    /// Only transitions into this state (no operation ends).
    pub state: Option<String>,
    /// Only what this request caused.
    pub request_id: Option<String>,
    /// Only `transition`s or only `operation` ends (default both).
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub kind: Option<String>,
    /// Start after this position (an event's `id`; `0`: from the oldest kept). The
    /// `Last-Event-ID` header, sent by a reconnecting client, wins. Neither: from now on.
    pub since: Option<String>,
    /// `true`: instead of each change, one `changes` event per read of the store with how
    /// many there were (`{"count": n}`): for a client that only needs to know that
    /// something changed (a dashboard's overview), at any rate of change.
    pub coalesce: Option<String>,
}
