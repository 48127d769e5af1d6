//! Agent tasks (DESIGN §5.3): when a heartbeat or report holds, replays or is refused, what
//! a lease, a heartbeat and a report write to the task's row, and the report that goes to
//! the entity's inbox — decided from the task's row as read, with no database.

use crate::plan::rows::TaskRow;
use crate::{AgentReport, AgentTask, Millis, OpError, TaskCheck, TaskRefusal, TaskResult};

/// What an agent's heartbeat or report with `token` meets on a task in `status`, last
/// leased with `held` until `locked_until`, at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lease {
    /// The token holds the live lease: the heartbeat or report applies.
    Held,
    /// A report with the token whose report was applied already: a replay, which changes
    /// nothing and is answered as such (the first report stands).
    Replay,
    /// Refused, with the reason; nothing changes.
    Refused(String),
}

/// The rule of [`Lease`]: `report` says whether it is a report (a heartbeat is never a
/// replay).
pub(crate) fn lease(
    status: &str,
    held: Option<&str>,
    locked_until: Option<i64>,
    attempt: u32,
    token: &str,
    now: i64,
    report: bool,
) -> Lease {
    let refused = |reason: String| Lease::Refused(reason);
    match status {
        "done" if report && held == Some(token) => Lease::Replay,
        "done" => refused("already reported".into()),
        "canceled" => refused("canceled: the entity left the task's state, or was killed".into()),
        "leased" if held != Some(token) => {
            refused(format!("lease token superseded: the task was leased again (attempt {attempt})"))
        }
        "leased" if locked_until.is_none_or(|until| until <= now) => refused(format!(
            "lease expired {} ms ago (locked_until passed); the task is offered again",
            now - locked_until.unwrap_or(now)
        )),
        "leased" => Lease::Held,
        _ => refused("not leased: lease the task first".into()),
    }
}

/// The caller may not touch the task: its queue is not the caller's.
fn check_queue(row: &TaskRow, check: &TaskCheck) -> Result<(), OpError> {
    match check.serves(&row.queue) {
        true => Ok(()),
        false => Err(OpError::Task(TaskRefusal::QueueForbidden { task: row.id, queue: row.queue.clone() })),
    }
}

/// The task held by `token` at `now` and not replayed, or why not.
fn held(row: &TaskRow, token: &str, now: Millis, report: bool) -> Result<Lease, OpError> {
    match lease(&row.status, row.token.as_deref(), row.locked_until, row.attempt, token, now, report) {
        Lease::Refused(reason) => Err(OpError::Task(TaskRefusal::Refused { task: row.id, reason })),
        other => Ok(other),
    }
}

/// A heartbeat: the lease ends one lock time from `now`. Answers the task's row afterwards.
pub(crate) fn heartbeat(row: &TaskRow, token: &str, check: &TaskCheck, now: Millis) -> Result<TaskRow, OpError> {
    check_queue(row, check)?;
    held(row, token, now, false)?;
    let until = now + row.lock_ms;
    Ok(TaskRow { locked_until: Some(until), available_at: until, ..row.clone() })
}

/// What a report does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reported {
    /// The same token reported before: nothing changes.
    Replayed,
    /// The task is done (its row afterwards), and `report` goes to its entity's inbox.
    Done { row: Box<TaskRow>, report: Box<AgentReport> },
}

/// A report on the task `row` of an entity of `machine`.
pub(crate) fn report(
    row: &TaskRow,
    machine: &str,
    token: &str,
    result: &TaskResult,
    check: &TaskCheck,
    now: Millis,
) -> Result<Reported, OpError> {
    check_queue(row, check)?;
    if let TaskResult::Complete(outcome) = result
        && let Some(action) = check.actions.get(&(machine.to_string(), row.action.clone()))
    {
        let bad = |field: String, reason: String| OpError::Task(TaskRefusal::BadReport { task: row.id, field, reason });
        if let Some(target) = &outcome.target
            && action.target(target).is_none()
        {
            let declared: Vec<&str> = action.targets.iter().map(|t| t.state.as_str()).collect();
            let why = format!(
                "action `{}` of machine `{machine}` may not move to `{target}` (declared: {})",
                row.action,
                declared.join(", ")
            );
            return Err(bad("target".into(), why));
        }
        let beyond = settle_core::step::beyond_declaration(action, outcome);
        if let Some((field, why)) = beyond.or_else(|| settle_core::step::engine_property(outcome)) {
            return Err(bad(field, why));
        }
        if let Some(m) = check.machines.get(machine) {
            if let Some((field, why)) = settle_core::step::foreign_reply(outcome, machine, |e| m.event(e).is_some()) {
                return Err(bad(field, why));
            }
            for (i, r) in outcome.internal.iter().enumerate() {
                if let Err(why) = settle_core::step::check_raise(m, &r.event, &r.params) {
                    return Err(bad(format!("raise_self[{i}]"), why.to_string()));
                }
            }
        }
    }
    if held(row, token, now, true)? == Lease::Replay {
        return Ok(Reported::Replayed);
    }
    let (outcome, error) = result.outcome();
    let done = TaskRow {
        status: "done".into(),
        finished_at: Some(now),
        outcome: Some(outcome.into()),
        error: error.map(str::to_string),
        ..row.clone()
    };
    let report = AgentReport {
        task: row.id,
        entity_version: row.entity_version,
        attempt: row.attempt,
        leased_at: row.leased_at.unwrap_or(now),
        agent: row.agent.clone(),
        result: result.clone(),
    };
    Ok(Reported::Done { row: Box::new(done), report: Box::new(report) })
}

/// Leases an available task to `agent` at `now`, with the token `token_prefix` + its id:
/// the task's row afterwards, and the task as the agent is told it.
pub(crate) fn lease_to(task: &AgentTask, agent: &str, token_prefix: &str, now: Millis) -> (TaskRow, AgentTask) {
    let until = now + task.lock_ms;
    let leased = AgentTask {
        status: "leased".into(),
        attempt: task.attempt + 1,
        token: Some(format!("{token_prefix}{}", task.id)),
        agent: Some(agent.to_string()),
        locked_until: Some(until),
        available_at: until,
        ..task.clone()
    };
    let row = TaskRow {
        id: leased.id,
        entity_id: leased.entity_id,
        queue: leased.queue.clone(),
        action: leased.action.to_string(),
        entity_version: leased.entity_version,
        request_id: leased.request_id.clone(),
        status: leased.status.clone(),
        attempt: leased.attempt,
        token: leased.token.clone(),
        agent: leased.agent.clone(),
        leased_at: Some(now),
        locked_until: leased.locked_until,
        lock_ms: leased.lock_ms,
        available_at: until,
        finished_at: None,
        outcome: None,
        error: None,
    };
    (row, leased)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn the_lease_rule() {
        let t = |status, held: Option<&str>, until: Option<i64>, token, now, report| {
            lease(status, held, until, 3, token, now, report)
        };
        assert_eq!(t("leased", Some("a"), Some(100), "a", 99, true), Lease::Held);
        assert_eq!(t("leased", Some("a"), Some(100), "a", 99, false), Lease::Held);
        let expired = t("leased", Some("a"), Some(100), "a", 100, true);
        assert!(matches!(&expired, Lease::Refused(r) if r.starts_with("lease expired 0 ms ago")), "{expired:?}");
        let superseded = t("leased", Some("b"), Some(100), "a", 50, true);
        assert!(matches!(&superseded, Lease::Refused(r) if r.contains("superseded") && r.contains("attempt 3")));
        // A report again with the token whose report was applied: a replay; not a heartbeat,
        // not another token's.
        assert_eq!(t("done", Some("a"), Some(100), "a", 500, true), Lease::Replay);
        assert_eq!(t("done", Some("a"), Some(100), "a", 50, false), Lease::Refused("already reported".into()));
        assert_eq!(t("done", Some("b"), Some(100), "a", 50, true), Lease::Refused("already reported".into()));
        assert!(
            matches!(t("canceled", Some("a"), Some(100), "a", 50, true), Lease::Refused(r) if r.starts_with("canceled"))
        );
        assert!(matches!(t("ready", None, None, "a", 50, true), Lease::Refused(r) if r.starts_with("not leased")));
    }

    fn leased() -> TaskRow {
        TaskRow {
            id: 9,
            entity_id: 7,
            queue: "cloud".into(),
            action: "provision".into(),
            entity_version: 4,
            request_id: Some("req-1".into()),
            status: "leased".into(),
            attempt: 2,
            token: Some("tok".into()),
            agent: Some("agent-a".into()),
            leased_at: Some(40),
            locked_until: Some(1_000),
            lock_ms: 900,
            available_at: 1_000,
            finished_at: None,
            outcome: None,
            error: None,
        }
    }

    /// `server`'s `provision`, run by agents: to `ready` or `broken`; may create an `app`
    /// and raise `start`.
    fn targets() -> TaskCheck {
        let m = settle_core::MachineBuilder::new("server")
            .state("provisioning")
            .initial()
            .auto("provision")
            .state("ready")
            .state("broken")
            .action("provision", ["ready", "broken"])
            .agent("cloud", std::time::Duration::from_secs(60))
            .may_create(["app"])
            .may_raise(["start"])
            .build()
            .unwrap();
        let mut t = BTreeMap::new();
        t.insert(("server".to_string(), "provision".to_string()), m.action("provision").unwrap().clone());
        TaskCheck { queues: None, actions: Arc::new(t), ..TaskCheck::default() }
    }

    fn complete(target: &str) -> TaskResult {
        TaskResult::complete(target, Default::default())
    }

    #[test]
    fn a_heartbeat_moves_the_lease_end_and_nothing_else() {
        let after = heartbeat(&leased(), "tok", &TaskCheck::default(), 500).unwrap();
        assert_eq!((after.locked_until, after.available_at), (Some(1_400), 1_400));
        assert_eq!(TaskRow { locked_until: Some(1_000), available_at: 1_000, ..after }, leased());
        let late = heartbeat(&leased(), "tok", &TaskCheck::default(), 1_000).unwrap_err();
        assert!(
            matches!(late, OpError::Task(TaskRefusal::Refused { task: 9, ref reason }) if reason.starts_with("lease expired"))
        );
        let other = heartbeat(&leased(), "old", &TaskCheck::default(), 500).unwrap_err();
        assert!(
            matches!(other, OpError::Task(TaskRefusal::Refused { task: 9, ref reason }) if reason.contains("superseded"))
        );
    }

    #[test]
    fn a_report_finishes_the_task_and_carries_its_lease_to_the_entity() {
        let fail = TaskResult::Fail { error: "quota".into(), retryable: true };
        let Reported::Done { row, report } = super::report(&leased(), "server", "tok", &fail, &targets(), 500).unwrap()
        else {
            panic!("applies")
        };
        assert_eq!(
            (row.status.as_str(), row.finished_at, row.outcome.as_deref(), row.error.as_deref()),
            ("done", Some(500), Some("fail"), Some("quota"))
        );
        assert_eq!((row.token.as_deref(), row.attempt), (Some("tok"), 2), "the lease stays recorded");
        assert_eq!(
            *report,
            AgentReport {
                task: 9,
                entity_version: 4,
                attempt: 2,
                leased_at: 40,
                agent: Some("agent-a".into()),
                result: fail.clone()
            }
        );
        let Reported::Done { row, .. } =
            super::report(&leased(), "server", "tok", &complete("ready"), &targets(), 500).unwrap()
        else {
            panic!("applies")
        };
        assert_eq!((row.outcome.as_deref(), row.error.as_deref()), (Some("complete"), None));
        // The same token again: a replay; another token: refused.
        let done = *row;
        assert_eq!(super::report(&done, "server", "tok", &fail, &targets(), 600), Ok(Reported::Replayed));
        let other = super::report(&done, "server", "new", &fail, &targets(), 600).unwrap_err();
        assert_eq!(other, OpError::Task(TaskRefusal::Refused { task: 9, reason: "already reported".into() }));
    }

    #[test]
    fn a_report_is_checked_against_the_callers_queues_and_the_actions_targets() {
        let mut check = targets();
        let err = super::report(&leased(), "server", "tok", &complete("gone"), &check, 500).unwrap_err();
        assert!(
            matches!(&err, OpError::Task(TaskRefusal::BadReport { task: 9, field, reason }) if field == "target" && reason.contains("may not move to `gone`") && reason.contains("ready, broken")),
            "{err:?}"
        );
        // Another machine's action of the same name is not this one's.
        assert!(super::report(&leased(), "database", "tok", &complete("gone"), &check, 500).is_ok());
        // What it creates and raises is held to its declaration.
        let with = |creates: &[&str], raises: &[&str]| {
            let mut o = settle_core::ActionOutcome { target: Some("ready".into()), ..Default::default() };
            for m in creates {
                o.creates.push(settle_core::step::Create {
                    machine: (*m).into(),
                    key: "k".into(),
                    properties: Default::default(),
                });
            }
            for e in raises {
                let (machine, key, event) = ("app".into(), "k".into(), (*e).into());
                o.raises.push(settle_core::step::Raise {
                    machine,
                    key,
                    event,
                    params: serde_json::Value::Null,
                    join: false,
                    reply: None,
                });
            }
            TaskResult::Complete(o)
        };
        assert!(super::report(&leased(), "server", "tok", &with(&["app", "app"], &["start"]), &check, 500).is_ok());
        for (result, at, why) in [
            (with(&["app", "db"], &[]), "create[1]", "may not create a `db` entity (`may_create`: app)"),
            (with(&["app"], &["start", "stop"]), "raise[1]", "may not raise `stop` (`may_raise`: start)"),
        ] {
            let err = super::report(&leased(), "server", "tok", &result, &check, 500).unwrap_err();
            assert!(
                matches!(&err, OpError::Task(TaskRefusal::BadReport { field, reason, .. }) if field == at && reason.contains(why)),
                "{err:?}"
            );
        }
        check.queues = Some(vec!["other".into()]);
        let err = super::report(&leased(), "server", "tok", &complete("ready"), &check, 500).unwrap_err();
        assert_eq!(err, OpError::Task(TaskRefusal::QueueForbidden { task: 9, queue: "cloud".into() }));
        let err = heartbeat(&leased(), "tok", &check, 500).unwrap_err();
        assert_eq!(err, OpError::Task(TaskRefusal::QueueForbidden { task: 9, queue: "cloud".into() }));
        check.queues = Some(vec!["other".into(), "cloud".into()]);
        assert!(heartbeat(&leased(), "tok", &check, 500).is_ok());
    }

    #[test]
    fn a_lease_takes_the_next_attempt_with_a_token_of_its_own() {
        let task = AgentTask {
            id: 9,
            queue: "cloud".into(),
            machine: "server".into(),
            key: "s1".into(),
            entity_id: 7,
            state: "provisioning".into(),
            action: "provision".into(),
            entity_version: 4,
            retry: 0,
            properties: Default::default(),
            errors: 0,
            request_id: None,
            status: "ready".into(),
            attempt: 0,
            token: None,
            agent: None,
            locked_until: None,
            lock_ms: 900,
            available_at: 50,
            created_at: 10,
            outcome: None,
            error: None,
            event: None,
            params: serde_json::Value::Null,
        };
        let (row, told) = lease_to(&task, "agent-b", "p.", 100);
        assert_eq!(
            (told.status.as_str(), told.attempt, told.token.as_deref(), told.agent.as_deref(), told.locked_until),
            ("leased", 1, Some("p.9"), Some("agent-b"), Some(1_000))
        );
        assert_eq!(told.available_at, 1_000, "offered again when the lease ends");
        assert_eq!((row.leased_at, row.locked_until, row.token.clone()), (Some(100), Some(1_000), told.token.clone()));
        // An expired lease leased again: the next attempt, a new token.
        let (_, again) = lease_to(&told, "agent-c", "q.", 2_000);
        assert_eq!((again.attempt, again.token.as_deref()), (2, Some("q.9")));
    }
}
