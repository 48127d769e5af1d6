//! The handlers, one module per resource. Each module offers its routes as
//! [`OpenApiRouter`](utoipa_axum::router::OpenApiRouter)s grouped by access (`read`,
//! `write`), which [`crate::router::api`] puts behind [`crate::auth::guard`].

pub mod bulk;
pub mod entities;
pub mod events;
pub mod feed;
pub mod lifecycle;
pub mod limits;
pub mod machines;
pub mod operations;
pub mod overview;
pub mod queues;
mod report;
pub mod schedules;
pub mod system;

use settle_core::StateKind;
use settle_store::EntityRow;

use crate::contract::{self, LIMIT};
use crate::problem::{Kind, Problem};
use crate::state::AppState;

/// Longest entity key, in characters (as [`contract::KEY`] says).
pub const MAX_KEY: usize = 256;

/// Parses a `limit` query parameter ([`contract::LIMIT`]).
pub(crate) fn parse_limit(limit: Option<&str>) -> Result<u64, Problem> {
    let Some(text) = limit else { return Ok(LIMIT.default) };
    LIMIT.parse(text).ok_or_else(|| {
        Problem::new(Kind::BadRequest, format!("limit must be an integer from 1 to {}, not `{text}`", LIMIT.max))
            .field("limit")
    })
}

/// The problem of a query parameter `field` that must be one of the `expected` words
/// ([`contract::Words`]): 400, naming the field, the unknown `value` (a `what`) and the words.
pub(crate) fn unknown_word(field: &str, what: &str, value: &str, expected: contract::Words) -> Problem {
    Problem::new(Kind::BadRequest, format!("unknown {what} `{value}` (expected {})", expected.join(", "))).field(field)
}

/// Parses a duration query parameter `field` ([`contract::DURATION`]); 400 naming it.
pub(crate) fn parse_duration(field: &str, text: &str) -> Result<std::time::Duration, Problem> {
    contract::DURATION.matches(text).then(|| settle_core::duration::parse(text).ok()).flatten().ok_or_else(|| {
        Problem::new(Kind::BadRequest, format!("{field} must be a duration such as `30s` or `1h30m`, not `{text}`"))
            .field(field)
    })
}

/// Checks a new entity's key ([`contract::KEY`]): 1 to [`MAX_KEY`] characters, no
/// control characters.
/// The criteria no index holds (a property expression, error text, time ranges: RFC 3339
/// or `-2h`, read at `now`), checked; a problem of `kind` names the field (`prefix` before
/// it, as `filter.`).
pub(crate) fn narrow(
    c: settle_engine::NarrowText<'_>,
    now: i64,
    kind: Kind,
    prefix: &str,
) -> Result<settle_engine::Narrow, Problem> {
    settle_engine::Narrow::parse(c, now).map_err(|e| {
        let field = e.split_once(':').map(|(f, _)| f).unwrap_or_default();
        Problem::new(kind, e.clone()).field(format!("{prefix}{field}"))
    })
}

pub(crate) fn check_key(key: &str) -> Result<(), Problem> {
    if contract::KEY.matches(key) {
        return Ok(());
    }
    let n = key.chars().count();
    let why = if n == 0 {
        "an entity key must not be empty".to_string()
    } else if n > MAX_KEY {
        format!("an entity key has at most {MAX_KEY} characters (this one has {n})")
    } else if key.chars().any(char::is_control) {
        "an entity key must not contain control characters".to_string()
    } else {
        return Ok(());
    };
    Err(Problem::new(Kind::InvalidKey, why).field("key"))
}

/// The entity `key` of a served `machine`: 404 if either is unknown, 410 if the entity is
/// in its machine's deleted state.
pub(crate) async fn live_entity(s: &AppState, machine: &str, key: &str) -> Result<EntityRow, Problem> {
    let e = find_entity(s, machine, key).await?;
    let m = s.version_of(&e)?;
    if m.state(&e.state).is_some_and(|st| st.kind == StateKind::Deleted) {
        return Err(Problem::new(Kind::EntityDeleted, format!("entity `{key}` of machine `{machine}` was deleted"))
            .with("machine", machine)
            .with("key", key)
            .with("state", e.state.as_str()));
    }
    Ok(e)
}

/// The entity `key` of a served `machine`, in any state: 404 if either is unknown.
pub(crate) async fn find_entity(s: &AppState, machine: &str, key: &str) -> Result<EntityRow, Problem> {
    s.machine(machine)?;
    s.engine().get(machine, key).await?.ok_or_else(|| Problem::unknown_entity(machine, key))
}

/// Percent-encodes a path segment (everything but RFC 3986 unreserved characters).
pub(crate) fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The URL of an entity.
pub(crate) fn entity_location(machine: &str, key: &str) -> String {
    format!("/v1/machines/{}/entities/{}", encode_segment(machine), encode_segment(key))
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_and_limits_are_checked() {
        assert!(super::check_key("web-1").is_ok());
        assert!(super::check_key("").is_err());
        assert!(super::check_key("a\nb").is_err());
        assert!(super::check_key(&"k".repeat(257)).is_err());
        assert_eq!(super::parse_limit(None).unwrap(), 100);
        assert!(super::parse_limit(Some("0")).is_err());
        assert!(super::parse_limit(Some("1001")).is_err());
        assert!(super::parse_limit(Some("x")).is_err());
        assert_eq!(super::encode_segment("a b/ü"), "a%20b%2F%C3%BC");
    }
}
