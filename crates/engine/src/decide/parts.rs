//! The parts of a commit that transitions, faults and rejections share: the agent task an
//! entry offers, the timers it plans, the `events` row of a processed item.

use std::time::Duration;

use settle_core::step;
use settle_core::{Machine, StateName};
use settle_store::{Millis, TaskOffer, TimerPlan};

/// The agent task entering `state` (or backing off in it) offers, available at `at`: when
/// its auto action is bound to an agent queue and counts against no concurrency limit (such
/// a task is offered once its slot is taken: the entity is due at `at` instead).
pub(super) fn entry_offer(machine: &Machine, state: &str, at: Millis) -> Option<TaskOffer> {
    if machine.is_limited(state) { None } else { task_offer(machine, state, at) }
}

/// The agent task of `state`, available at `at`: when its auto action is bound to an agent
/// queue.
pub(super) fn task_offer(machine: &Machine, state: &str, at: Millis) -> Option<TaskOffer> {
    let action = step::agent_action(machine, state)?;
    let binding = action.agent.as_ref()?;
    Some(TaskOffer {
        queue: binding.queue.clone(),
        action: action.name.clone(),
        lock_ms: ms(binding.lock),
        available_at: at,
    })
}

/// The stored timers an entity has after entering `to` from `from` at `now`.
pub(super) fn timer_plan(
    machine: &Machine,
    from: Option<&str>,
    to: &str,
    entered: &[StateName],
    now: Millis,
) -> Vec<TimerPlan> {
    step::timers_on_entry(machine, from, to, entered)
        .into_iter()
        .map(|t| TimerPlan {
            name: t.name,
            event: t.event,
            due_at: now + ms(t.after),
            every_ms: t.every.map(ms),
            restart: t.restart,
        })
        .collect()
}

pub(super) fn ms(d: Duration) -> Millis {
    d.as_millis() as Millis
}
