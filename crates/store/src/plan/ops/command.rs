//! Operator commands (DESIGN §4): what pause, resume, sleep, kill, release and retry do to
//! an entity, decided from its row and what it holds (inbox, open agent task), with no
//! database. The segment applies the [`Effect`] beside its other operations.

use crate::plan::rows::{Current, Facts};
use crate::{Command, EntityRow, Millis, OpError, RunStatus};

/// What a command does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Effect {
    /// The entity's columns afterwards (its due time included).
    pub(crate) row: Current,
    /// Its recent errors are forgotten (resume).
    pub(crate) clear_errors: bool,
    /// Its ready agent task is offered now, not after its delay or backoff (retry).
    pub(crate) offer_now: bool,
    /// Kill: its inbox, timers and open agent tasks are dropped, and the operations of the
    /// work dropped (these request ids) end as canceled.
    pub(crate) canceled: Option<Vec<String>>,
}

/// Decides `command` on the entity `cur` at `now`. A killed entity takes no command but
/// `kill` again.
pub(crate) fn decide(cur: &Current, facts: &Facts, command: Command, now: Millis) -> Result<Effect, OpError> {
    if cur.run_status == RunStatus::Killed && command != Command::Kill {
        return Err(OpError::Killed { machine: cur.machine.to_string(), key: cur.key.to_string() });
    }
    let mut row = cur.clone();
    let mut effect = Effect { row: cur.clone(), clear_errors: false, offer_now: false, canceled: None };
    match command {
        Command::Pause => {
            row.run_status = RunStatus::Paused;
            row.sleep_until = None;
        }
        Command::Resume => {
            // Back from a backoff or parking, the pending auto action runs now.
            if row.auto_at.is_some() && matches!(cur.run_status, RunStatus::Fault | RunStatus::Failed) {
                row.auto_at = Some(now);
            }
            row.run_status = RunStatus::Active;
            row.sleep_until = None;
            row.busy = row.auto_at.is_some() || facts.open_task;
            effect.clear_errors = true;
        }
        Command::Sleep { until } => {
            row.run_status = RunStatus::Sleeping;
            row.sleep_until = Some(until);
        }
        Command::Kill => {
            row.run_status = RunStatus::Killed;
            row.sleep_until = None;
            // Any commit in flight is refused by the fence.
            row.version += 1;
            row.busy = false;
            row.lease_owner = None;
            row.lease_until = None;
            row.auto_at = None;
            row.timer_at = None;
            let mut canceled = facts.inbox_requests.clone();
            if let Some(r) = &cur.request_id
                && !canceled.iter().any(|c| **c == **r)
            {
                canceled.push(r.to_string());
            }
            effect.canceled = Some(canceled);
        }
        Command::Release => {
            row.lease_owner = None;
            row.lease_until = None;
        }
        Command::Retry => {
            if row.auto_at.is_some() {
                row.auto_at = Some(now);
            }
            row.run_status = RunStatus::Active;
            row.sleep_until = None;
            row.busy = row.auto_at.is_some() || facts.open_task;
            effect.offer_now = true;
        }
    }
    let inbox = facts.inbox && command != Command::Kill;
    row.due_at = row.due(inbox, now);
    effect.row = row;
    Ok(effect)
}

/// The entity as a read after the command would return it: `before` (read with the
/// command) with the columns of `after`.
pub(crate) fn entity_after(before: &EntityRow, after: &Current, clear_errors: bool) -> EntityRow {
    EntityRow {
        state: after.state.clone().into(),
        version: after.version,
        retry: after.retry as u32,
        entered_at: after.entered_at,
        auto_at: after.auto_at,
        due_at: after.due_at,
        lease_owner: after.lease_owner.as_deref().map(str::to_string),
        lease_until: after.lease_until,
        request_id: after.request_id.as_deref().map(str::to_string),
        timer_at: after.timer_at,
        run_status: after.run_status,
        sleep_until: after.sleep_until,
        recent_errors: if clear_errors { Vec::new() } else { before.recent_errors.clone() },
        event_id: after.event_id,
        machine_hash: after.machine_hash.as_deref().map(str::to_string),
        ..before.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: RunStatus) -> Current {
        Current {
            id: 7,
            machine: "server".into(),
            key: "s1".into(),
            state: "provisioning".into(),
            version: 4,
            retry: 1,
            entered_at: 10,
            auto_at: Some(500),
            due_at: Some(500),
            lease_owner: Some("engine-a".into()),
            lease_until: Some(900),
            request_id: Some("req-1".into()),
            timer_at: Some(700),
            run_status: status,
            sleep_until: if matches!(status, RunStatus::Fault | RunStatus::Sleeping) { Some(800) } else { None },
            busy: true,
            event_id: Some(3),
            ordinal: 2,
            has_predecessors: false,
            machine_hash: None,
            ended_at: None,
        }
    }

    const NOW: Millis = 100;

    fn facts(inbox: bool, open_task: bool) -> Facts {
        Facts { inbox, inbox_requests: vec!["req-2".into()], open_task }
    }

    /// One row of the table: the command, the status before, what the entity holds, and
    /// the columns expected after (run status, sleep, auto action, busy, lease kept, due).
    struct Case {
        command: Command,
        before: RunStatus,
        inbox: bool,
        open_task: bool,
        status: RunStatus,
        sleep_until: Option<Millis>,
        auto_at: Option<Millis>,
        busy: bool,
        leased: bool,
        due: Option<Millis>,
    }

    #[test]
    fn each_command_sets_the_columns_its_rule_says() {
        use RunStatus::*;
        let c = |command, before, inbox, open_task, status, sleep_until, auto_at, busy, leased, due| Case {
            command,
            before,
            inbox,
            open_task,
            status,
            sleep_until,
            auto_at,
            busy,
            leased,
            due,
        };
        let cases = [
            // Paused: never due, the lease and auto action kept for later.
            c(Command::Pause, Active, true, false, Paused, None, Some(500), true, true, None),
            // Resumed from a backoff: the auto action runs now; still leased, due at the lease's end.
            c(Command::Resume, Fault, false, false, Active, None, Some(NOW), true, true, Some(900)),
            // Resumed from a pause: the auto action keeps its time.
            c(Command::Resume, Paused, false, false, Active, None, Some(500), true, true, Some(900)),
            c(
                Command::Sleep { until: 5_000 },
                Active,
                true,
                false,
                Sleeping,
                Some(5_000),
                Some(500),
                true,
                true,
                Some(5_000),
            ),
            // Killed: nothing left to do, never due.
            c(Command::Kill, Active, true, true, Killed, None, None, false, false, None),
            // Released: free now, due now for its queued event.
            c(Command::Release, Active, true, false, Active, None, Some(500), true, false, Some(NOW)),
            // Released with nothing queued: due at the earlier of its auto action and timer.
            c(Command::Release, Active, false, false, Active, None, Some(500), true, false, Some(500)),
            c(Command::Retry, Failed, false, false, Active, None, Some(NOW), true, true, Some(900)),
        ];
        for (i, case) in cases.iter().enumerate() {
            let before = row(case.before);
            let e = decide(&before, &facts(case.inbox, case.open_task), case.command, NOW).expect("applies");
            let r = &e.row;
            let what = format!("case {i}: {} from {:?}", case.command.as_str(), case.before);
            assert_eq!(r.run_status, case.status, "{what}");
            assert_eq!(r.sleep_until, case.sleep_until, "{what}");
            assert_eq!(r.auto_at, case.auto_at, "{what}");
            assert_eq!(r.busy, case.busy, "{what}");
            assert_eq!(r.lease_owner.is_some(), case.leased, "{what}");
            assert_eq!(r.lease_until.is_some(), case.leased, "{what}");
            assert_eq!(r.due_at, case.due, "{what}");
            assert_eq!(r.version, before.version + i64::from(case.command == Command::Kill), "{what}: version");
            assert_eq!(e.clear_errors, case.command == Command::Resume, "{what}");
            assert_eq!(e.offer_now, case.command == Command::Retry, "{what}");
            assert_eq!(e.canceled.is_some(), case.command == Command::Kill, "{what}");
            assert_eq!((&*r.state, r.retry, r.entered_at), ("provisioning", 1, 10), "{what}: the state stays");
        }
    }

    #[test]
    fn resume_and_retry_are_busy_while_an_agent_task_is_open() {
        let mut parked = row(RunStatus::Failed);
        parked.auto_at = None;
        parked.busy = false;
        for command in [Command::Resume, Command::Retry] {
            let idle = decide(&parked, &facts(false, false), command, NOW).unwrap();
            assert!(!idle.row.busy, "{}: no auto action, no task", command.as_str());
            let waiting = decide(&parked, &facts(false, true), command, NOW).unwrap();
            assert!(waiting.row.busy, "{}: its agent task is open", command.as_str());
        }
    }

    #[test]
    fn kill_cancels_the_work_queued_and_the_work_in_progress() {
        let e = decide(&row(RunStatus::Active), &facts(true, true), Command::Kill, NOW).unwrap();
        assert_eq!(e.canceled, Some(vec!["req-2".to_string(), "req-1".to_string()]));
        assert_eq!(e.row.timer_at, None);
        let mut quiet = row(RunStatus::Active);
        quiet.request_id = Some("req-2".into());
        let e = decide(&quiet, &facts(true, false), Command::Kill, NOW).unwrap();
        assert_eq!(e.canceled, Some(vec!["req-2".to_string()]), "each operation once");
    }

    #[test]
    fn a_killed_entity_takes_only_kill() {
        let killed = row(RunStatus::Killed);
        for command in [Command::Pause, Command::Resume, Command::Sleep { until: 1 }, Command::Release, Command::Retry]
        {
            let err = decide(&killed, &Facts::default(), command, NOW).unwrap_err();
            assert_eq!(err, OpError::Killed { machine: "server".into(), key: "s1".into() }, "{}", command.as_str());
        }
        assert!(decide(&killed, &Facts::default(), Command::Kill, NOW).is_ok());
    }
}
