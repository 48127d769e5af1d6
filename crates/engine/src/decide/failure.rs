//! What an entry into an error-health state records: an error of kind `failure` saying why
//! (the action's own message, else what moved the entity) and who caused it (the
//! successors a subscription matched), so a failed parent leads to its failed child.

use serde_json::Value;
use settle_core::{Health, Machine};
use settle_store::{CauseRef, ErrorRecord, InboxItem, InboxKind};

/// How many causes the message names before "and N more" (the `cause` list keeps all).
const NAMED: usize = 3;

/// The `failure` a transition from `from` to `to` records: when it enters an error-health
/// state from one that is not (or the action gave a message, `error`). `item` is the event
/// it processed (`None`: an auto action), `action` the action that ran.
pub(super) fn failure(
    machine: &Machine,
    from: &str,
    to: &str,
    error: Option<&str>,
    item: Option<&InboxItem>,
    action: &str,
) -> Option<ErrorRecord> {
    let entering = machine.health_of(to) == Health::Error && machine.health_of(from) != Health::Error;
    if !entering && error.is_none() {
        return None;
    }
    let cause = item.filter(|i| i.kind == InboxKind::Notice).map(|i| matched(&i.params)).unwrap_or_default();
    let details = match (error, item) {
        (Some(message), _) => message.to_string(),
        (None, Some(i)) if !cause.is_empty() => format!("`{}` fired: {}", i.event, named(&cause)),
        (None, Some(i)) if i.kind == InboxKind::Timer => format!("timer `{}` fired in `{from}`", i.event),
        (None, Some(i)) => format!("event `{}` in `{from}`", i.event),
        (None, None) => format!("action `{action}` in `{from}`"),
    };
    Some(ErrorRecord { kind: "failure", details, exception: None, retried: false, cause })
}

/// The successors a subscription event's parameters name (`{"matched": [{machine, key,
/// state}]}`).
fn matched(params: &Value) -> Vec<CauseRef> {
    let field = |m: &Value, f: &str| m.get(f).and_then(Value::as_str).map(str::to_string);
    params
        .get("matched")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| {
            Some(CauseRef { machine: field(m, "machine")?, key: field(m, "key")?, state: field(m, "state")? })
        })
        .collect()
}

/// `dns/web-dns in failed`, the first few of them, then how many more.
fn named(cause: &[CauseRef]) -> String {
    let mut text: Vec<String> =
        cause.iter().take(NAMED).map(|c| format!("{}/{} in `{}`", c.machine, c.key, c.state)).collect();
    if cause.len() > NAMED {
        text.push(format!("{} more", cause.len() - NAMED));
    }
    text.join(", ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use settle_core::MachineBuilder;
    use settle_store::{CauseRef, InboxItem, InboxKind};

    use super::failure;

    fn machine() -> settle_core::Machine {
        MachineBuilder::new("server")
            .state("waiting")
            .initial()
            .state("undoing")
            .error_health()
            .state("failed")
            .error_health()
            .event("gave_up", ["waiting"], "undo")
            .action("undo", ["undoing"])
            .build()
            .unwrap()
    }

    fn item(kind: InboxKind, event: &str, params: serde_json::Value) -> InboxItem {
        InboxItem {
            id: 1,
            entity_id: 1,
            event: settle_core::EventName::new(event),
            params,
            request_id: None,
            kind,
            created_at: 0,
            reply: None,
        }
    }

    #[test]
    fn entering_an_error_state_records_why_and_who() {
        let m = machine();
        let notice = item(
            InboxKind::Notice,
            "gave_up",
            json!({"matched": [{"machine": "dns", "key": "a-dns", "state": "failed"},
                               {"machine": "app", "key": "a-app", "state": "failed"}]}),
        );
        let f = failure(&m, "waiting", "undoing", None, Some(&notice), "undo").unwrap();
        assert_eq!(f.kind, "failure");
        assert_eq!(f.details, "`gave_up` fired: dns/a-dns in `failed`, app/a-app in `failed`");
        assert_eq!(
            f.cause,
            vec![
                CauseRef { machine: "dns".into(), key: "a-dns".into(), state: "failed".into() },
                CauseRef { machine: "app".into(), key: "a-app".into(), state: "failed".into() },
            ]
        );
        assert!(!f.retried, "a failure fails its operation");
        // The action's own message wins; the cause stays.
        let f = failure(&m, "waiting", "undoing", Some("quota exceeded"), Some(&notice), "undo").unwrap();
        assert_eq!((f.details.as_str(), f.cause.len()), ("quota exceeded", 2));
        // A timer, a raised event, an auto action: what moved it.
        let timer = item(InboxKind::Timer, "gave_up", json!(null));
        assert_eq!(
            failure(&m, "waiting", "undoing", None, Some(&timer), "undo").unwrap().details,
            "timer `gave_up` fired in `waiting`"
        );
        let raised = item(InboxKind::Raised, "gave_up", json!(null));
        assert_eq!(
            failure(&m, "waiting", "undoing", None, Some(&raised), "undo").unwrap().details,
            "event `gave_up` in `waiting`"
        );
        assert_eq!(
            failure(&m, "waiting", "undoing", None, None, "undo").unwrap().details,
            "action `undo` in `waiting`"
        );
    }

    #[test]
    fn only_a_first_entry_into_error_or_a_message_records_a_failure() {
        let m = machine();
        // From one error state to another: the failure was recorded on the way in.
        assert_eq!(failure(&m, "undoing", "failed", None, None, "undo"), None);
        // Unless the action says why.
        let f = failure(&m, "undoing", "failed", Some("could not undo: 403"), None, "undo").unwrap();
        assert_eq!(f.details, "could not undo: 403");
        // Out of error, nothing.
        assert_eq!(failure(&m, "failed", "waiting", None, None, "undo"), None);
    }

    #[test]
    fn many_causes_are_named_a_few_at_a_time() {
        let m = machine();
        let matched: Vec<_> =
            (0..5).map(|i| json!({"machine": "r", "key": format!("k{i}"), "state": "failed"})).collect();
        let notice = item(InboxKind::Notice, "gave_up", json!({ "matched": matched }));
        let f = failure(&m, "waiting", "undoing", None, Some(&notice), "undo").unwrap();
        assert_eq!(f.details, "`gave_up` fired: r/k0 in `failed`, r/k1 in `failed`, r/k2 in `failed`, 2 more");
        assert_eq!(f.cause.len(), 5);
    }
}
