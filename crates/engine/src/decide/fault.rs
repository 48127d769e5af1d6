//! What a failed action commits (DESIGN §4): the machine's fault policy parks the entity
//! or backs it off; an event's action consumes its event and changes nothing else, an
//! auto action re-enters its state after the backoff.

use settle_core::fault::FaultDecision;
use settle_store::{
    AfterCommit, Commit, ErrorRecord, EventRecord, HistoryKind, InboxItem, RunStatus, Telemetry, TransitionRecord,
};

use super::parts::{entry_offer, ms};
use super::{Decided, Env, Held, Note};
use crate::api::EventOutcome;
use crate::handler::{HandlerError, Outcome};

/// A failed action, as the fault policy and the `errors` table see it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FaultError {
    pub(crate) kind: &'static str,
    pub(crate) details: String,
    pub(crate) exception: Option<String>,
    /// Trying again cannot help (an agent's non-retryable failure): park at once.
    pub(crate) fatal: bool,
}

impl FaultError {
    pub(crate) fn new(kind: &'static str, details: impl Into<String>) -> Self {
        FaultError { kind, details: details.into(), exception: None, fatal: false }
    }

    /// A handler's result as the decisions take it: its error or panic becomes a fault.
    pub(crate) fn of_handler(
        r: std::result::Result<std::result::Result<Outcome, HandlerError>, String>,
    ) -> std::result::Result<Outcome, FaultError> {
        match r {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(e)) => Err(FaultError::new("action_error", format!("action error: {e}"))),
            Err(panic) => Err(FaultError {
                kind: "panic",
                details: format!("action panicked: {panic}"),
                exception: Some(panic),
                fatal: false,
            }),
        }
    }
}

/// An action failed (error, panic, refused outcome, failed commit). The machine's fault
/// policy decides: park the entity (`failed`, for an operator), or back off. An event's
/// action consumes the event and changes no state; an auto action re-enters its state
/// after the backoff (run status `fault` meanwhile), counting the retry.
pub(crate) fn fault(
    held: &mut Held,
    item: Option<InboxItem>,
    action: Option<&str>,
    error: FaultError,
    env: &Env<'_>,
) -> Decided {
    let now = env.now;
    let after_unchanged = held.after_unchanged(now);
    let unstable = held.unstable();
    let fence = held.fence(env.owner);
    let e = &held.entity;
    let (mut decision, recent) = held.machine.fault_policy().decide(&e.recent_errors, now);
    if error.fatal {
        decision = FaultDecision::Park;
    }
    let parked = matches!(decision, FaultDecision::Park);
    let note = Note::Fault { kind: error.kind, details: error.details.clone(), parked };
    let health = held.machine.health_of(&e.state).as_str();
    let mut base = Commit {
        retry: e.retry,
        action: action.map(Into::into),
        event: item.as_ref().map(|i| i.event.clone()),
        consume: item.as_ref().map(|i| i.id).or(held.agent_report.take()),
        request_id: item.as_ref().and_then(|i| i.request_id.clone()).or_else(|| e.request_id.clone()),
        detail: Some(error.details.clone()),
        recent_errors: Some(recent),
        machine_hash: held.version(env),
        telemetry: Telemetry {
            event: item.as_ref().map(|i| EventRecord::of(i, false, true)),
            error: Some(ErrorRecord {
                kind: error.kind,
                details: error.details.clone(),
                exception: error.exception,
                // An auto action backed off runs again; an event's action does not.
                retried: item.is_none() && !parked,
                cause: Vec::new(),
            }),
            current_event: e.event_id,
            ..Telemetry::default()
        },
        ..Commit::new(fence, e.state.clone(), HistoryKind::Fault, AfterCommit::Release)
    };
    if let Some(f) = held.firing.take() {
        // The subscription fired (once per entry) even though its action failed.
        let mut fired = e.fired.clone();
        fired.push(f.event);
        base.fired = Some(fired);
        base.consume_notices_upto = Some(f.notices_upto);
    }
    if parked {
        base.run_status = Some((RunStatus::Failed, None));
    }
    let (commit, outcome) = if item.is_some() {
        let after = if parked { AfterCommit::Release } else { after_unchanged };
        let at_rest = parked || !unstable;
        (
            Commit { after, telemetry: Telemetry { at_rest, complete: true, ..base.telemetry.clone() }, ..base },
            Some(EventOutcome::Failed { error: error.details }),
        )
    } else {
        let retry = e.retry + 1;
        let (auto_at, status) = match decision {
            // Parked: the auto action runs again at once when an operator resumes it.
            FaultDecision::Park => (now, base.run_status),
            FaultDecision::Backoff(d) => {
                let until = now + ms(d);
                (until, Some((RunStatus::Fault, Some(until))))
            }
        };
        let transition = TransitionRecord {
            kind: "auto_action",
            start_health: Some(health),
            end_health: health,
            entry_time: e.entered_at,
            start_time: now,
            action_start_time: None,
            outcome: "error",
        };
        // An agent-bound auto action offers its next task for the end of the backoff (a
        // parked entity offers it when resumed).
        let offer = if parked { None } else { entry_offer(&held.machine, &e.state, auto_at) };
        (
            Commit {
                to: Some(e.state.clone()),
                retry,
                auto_at: if offer.is_some() { None } else { Some(auto_at) },
                offer,
                run_status: status,
                telemetry: Telemetry {
                    transition: Some(transition),
                    at_rest: parked,
                    complete: parked,
                    ..base.telemetry.clone()
                },
                ..base
            },
            None,
        )
    };
    // A fault commit has no effects, so it can only fail by losing the lease.
    Decided { item, outcome, note: Some(note), ..Decided::new(commit) }
}
