//! Canceling an operation on one entity it reached (DESIGN §1 "Operations", §9): what
//! becomes of the entity's queued events of the operation, of the work it does in it, and
//! whether its machine's cancel event undoes its part — decided from its row and what it
//! holds, with no database. The segment applies the [`Effect`] beside its other operations.

use crate::plan::rows::{Current, Facts};
use crate::{CancelOutcome, Millis, RunStatus, Undo};

/// What canceling operation `canceled` does to one entity.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Effect {
    /// The entity's columns afterwards (its due time included).
    pub(crate) row: Current,
    /// Its queued events of the operation are dropped.
    pub(crate) drop_queued: bool,
    /// The work it did when canceled is stopped: its version moved (a result in flight
    /// is refused by the fence), its lease dropped, its open agent tasks canceled.
    pub(crate) stopped: bool,
    /// The machine's cancel event is queued on it.
    pub(crate) undo: bool,
    /// What the entity's part in the operation came to.
    pub(crate) outcome: CancelOutcome,
}

/// Decides the cancel of operation `canceled` on the entity `cur` at `now`. `undo` is its
/// machine's cancel event with the states where it is valid. The rules:
/// - its queued events of the operation are dropped;
/// - the work it does is stopped when that work is the operation's (its current request
///   id), or when an engine holds it while events of the operation are queued (the one
///   being processed may be among them);
/// - where its state is the operation's doing (its current request id) and the cancel
///   event is valid there, the event is queued: its undo path runs;
/// - work stopped with no undo valid leaves it paused for an operator (a resume runs its
///   pending action again);
/// - a killed entity, or one the operation left no trace on, is untouched.
pub(crate) fn decide(cur: &Current, facts: &Facts, canceled: &str, undo: Option<&Undo>, now: Millis) -> Effect {
    let untouched =
        Effect { row: cur.clone(), drop_queued: false, stopped: false, undo: false, outcome: CancelOutcome::Untouched };
    if cur.run_status == RunStatus::Killed {
        return untouched;
    }
    let queued = facts.inbox_requests.iter().any(|r| r == canceled);
    let its_doing = cur.request_id.as_deref() == Some(canceled);
    let working = its_doing && cur.busy;
    let stop = working || (queued && cur.lease_owner.is_some());
    let undo = its_doing && undo.is_some_and(|u| u.states.iter().any(|s| s.as_str() == &*cur.state));
    if !queued && !stop && !undo {
        return untouched;
    }
    let mut row = cur.clone();
    if stop {
        // A result in flight is refused by the fence; whatever held it lets go.
        row.version += 1;
        row.lease_owner = None;
        row.lease_until = None;
        // Its work in the operation is over: the operation may end (as canceled).
        row.busy = false;
        if facts.open_task && row.auto_at.is_none() {
            // The agent's task is canceled: a resume offers it again.
            row.auto_at = Some(now);
        }
    }
    let outcome = if undo {
        // The operation's retries end here: the undo runs now.
        if matches!(row.run_status, RunStatus::Fault | RunStatus::Failed) {
            row.run_status = RunStatus::Active;
            row.sleep_until = None;
        }
        CancelOutcome::Undone { stopped: stop }
    } else if working {
        row.run_status = RunStatus::Paused;
        row.sleep_until = None;
        CancelOutcome::Paused
    } else {
        CancelOutcome::Dropped
    };
    // Other events may still be queued (and the undo is): due now if it may run.
    row.due_at = row.due(facts.inbox || undo, now);
    Effect { row, drop_queued: queued, stopped: stop, undo, outcome }
}

#[cfg(test)]
mod tests {
    use settle_core::{EventName, StateName};

    use super::*;

    fn row(state: &str, request_id: &str, busy: bool) -> Current {
        Current {
            id: 7,
            machine: "vm".into(),
            key: "v1".into(),
            state: state.into(),
            version: 4,
            retry: 0,
            entered_at: 100,
            auto_at: busy.then_some(150),
            due_at: busy.then_some(150),
            lease_owner: None,
            lease_until: None,
            request_id: Some(request_id.into()),
            timer_at: None,
            run_status: RunStatus::Active,
            sleep_until: None,
            busy,
            event_id: None,
            ordinal: 0,
            has_predecessors: false,
            machine_hash: None,
            ended_at: None,
        }
    }

    fn undo() -> Undo {
        Undo { event: EventName::new("abort"), states: vec![StateName::new("provisioning"), StateName::new("ready")] }
    }

    fn facts(requests: &[&str], open_task: bool) -> Facts {
        Facts {
            inbox: !requests.is_empty(),
            inbox_requests: requests.iter().map(|r| r.to_string()).collect(),
            open_task,
        }
    }

    #[test]
    fn working_in_the_operation_it_stops_and_undoes_where_the_cancel_event_is_valid() {
        let cur = row("provisioning", "op", true);
        let e = decide(&cur, &facts(&[], false), "op", Some(&undo()), 200);
        assert_eq!(e.outcome, CancelOutcome::Undone { stopped: true });
        assert!(e.stopped && e.undo && !e.drop_queued);
        assert_eq!((e.row.version, e.row.busy, e.row.due_at), (5, false, Some(200)), "due now: its undo runs");
        // A backoff of the operation's work ends: the undo runs now.
        let faulted = Current { run_status: RunStatus::Fault, sleep_until: Some(9_000), ..cur.clone() };
        let e = decide(&faulted, &facts(&[], false), "op", Some(&undo()), 200);
        assert_eq!((e.row.run_status, e.row.sleep_until, e.row.due_at), (RunStatus::Active, None, Some(200)));
    }

    #[test]
    fn working_with_no_valid_cancel_event_it_is_paused_and_a_resume_offers_its_task_again() {
        let cur = Current { auto_at: None, due_at: None, ..row("configuring", "op", true) };
        let e = decide(&cur, &facts(&[], true), "op", Some(&undo()), 200);
        assert_eq!(e.outcome, CancelOutcome::Paused);
        assert!(e.stopped && !e.undo);
        assert_eq!((e.row.run_status, e.row.auto_at, e.row.due_at), (RunStatus::Paused, Some(200), None));
        let e = decide(&cur, &facts(&[], true), "op", None, 200);
        assert_eq!(e.outcome, CancelOutcome::Paused, "no cancel event declared at all");
    }

    #[test]
    fn at_rest_its_state_is_undone_only_when_the_operation_brought_it_there() {
        let ready = row("ready", "op", false);
        let e = decide(&ready, &facts(&[], false), "op", Some(&undo()), 200);
        assert_eq!(e.outcome, CancelOutcome::Undone { stopped: false });
        assert_eq!((e.row.version, e.row.due_at), (4, Some(200)), "not stopped: its version stays");
        // Another operation moved it since: the canceled one's doing is gone.
        let moved = row("ready", "other", false);
        assert_eq!(decide(&moved, &facts(&[], false), "op", Some(&undo()), 200).outcome, CancelOutcome::Untouched);
        // Where the cancel event is not valid, nothing.
        let done = row("retired", "op", false);
        assert_eq!(decide(&done, &facts(&[], false), "op", Some(&undo()), 200).outcome, CancelOutcome::Untouched);
    }

    #[test]
    fn queued_events_are_dropped_and_a_holder_processing_them_is_stopped() {
        let other = row("ready", "other", false);
        let e = decide(&other, &facts(&["op", "other"], false), "op", Some(&undo()), 200);
        assert_eq!(e.outcome, CancelOutcome::Dropped);
        assert!(e.drop_queued && !e.stopped && !e.undo);
        assert_eq!(e.row.due_at, Some(200), "the other operation's events are still queued");
        let held = Current { lease_owner: Some("e1".into()), lease_until: Some(900), ..other.clone() };
        let e = decide(&held, &facts(&["op"], false), "op", Some(&undo()), 200);
        assert!(e.stopped && e.drop_queued);
        assert_eq!((e.row.version, e.row.lease_owner.as_deref()), (5, None));
        // Work of another operation with nothing of this one queued: untouched.
        let busy = row("provisioning", "other", true);
        assert_eq!(decide(&busy, &facts(&[], false), "op", Some(&undo()), 200).outcome, CancelOutcome::Untouched);
    }

    #[test]
    fn a_killed_entity_is_untouched() {
        let killed = Current { run_status: RunStatus::Killed, ..row("provisioning", "op", false) };
        let e = decide(&killed, &facts(&["op"], false), "op", Some(&undo()), 200);
        assert_eq!(e.outcome, CancelOutcome::Untouched);
        assert_eq!(e.row, killed);
    }
}
