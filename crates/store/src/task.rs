//! Agent tasks (DESIGN §5): the task a commit offers ([`TaskOffer`]), the task as stored and
//! leased ([`AgentTask`]), what an agent reports ([`TaskResult`]) and how that report reaches
//! the entity's inbox ([`AgentReport`]), which tasks to list ([`TaskFilter`]), and what a
//! heartbeat or report must satisfy besides its lease ([`TaskCheck`]). The rules of leases,
//! heartbeats and reports are the plan's (`plan/ops/task.rs`).

use std::collections::BTreeMap;

use serde_json::Value;
use settle_core::step::PropChange;
use settle_core::{Action, ActionName, ActionOutcome, EntityKey, EventName, MachineName, Properties, StateName};

use crate::{InboxKind, Millis, Push};

/// An agent task offered by a commit (DESIGN §5): the entity's state has an agent-bound
/// auto action. The entity then has no `auto_at` of its own; the task carries the time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOffer {
    /// The agent queue.
    pub queue: String,
    /// The action the agent executes.
    pub action: ActionName,
    /// How long a lease on the task lasts.
    pub lock_ms: i64,
    /// When agents may lease it (the state's `wait`, a retry delay or a backoff).
    pub available_at: Millis,
}

/// An agent task as stored, with what an agent needs to execute it.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentTask {
    /// Its id.
    pub id: i64,
    /// The queue it is offered on.
    pub queue: String,
    /// The entity's machine.
    pub machine: MachineName,
    /// The entity's key.
    pub key: EntityKey,
    /// The entity's id.
    pub entity_id: i64,
    /// The state whose auto action it is.
    pub state: StateName,
    /// The action to execute.
    pub action: ActionName,
    /// The entity's version at the offer (the state entry the task belongs to).
    pub entity_version: i64,
    /// The entity's retry count of that state entry.
    pub retry: u32,
    /// The entity's properties now.
    pub properties: Properties,
    /// How many errors the entity's fault policy counts now.
    pub errors: u32,
    /// The request the work belongs to.
    pub request_id: Option<String>,
    /// ready | leased | done | canceled.
    pub status: String,
    /// How many times it was leased (this lease included).
    pub attempt: u32,
    /// The current lease's token (only shown to the agent that leased it).
    pub token: Option<String>,
    /// The agent holding or last holding it.
    pub agent: Option<String>,
    /// When the current lease ends.
    pub locked_until: Option<Millis>,
    /// How long a lease lasts.
    pub lock_ms: i64,
    /// When it may be leased next (while ready or leased).
    pub available_at: Millis,
    /// When it was offered.
    pub created_at: Millis,
    /// complete | fail | canceled, once finished.
    pub outcome: Option<String>,
    /// The error an agent reported.
    pub error: Option<String>,
    /// The event whose workflow the task's state entry belongs to: the one whose action
    /// entered the state, or began the chain of auto actions that did (`None`: none, e.g.
    /// the state the entity was created in).
    pub event: Option<EventName>,
    /// That event's parameters (null: none).
    pub params: Value,
}

/// What an agent reports on a task it leased.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskResult {
    /// The action is done, with its whole outcome (DESIGN §5): a declared target (or the
    /// same state again, after a delay), property changes, entities to create and events
    /// to raise — the value a Rust handler returns.
    Complete(ActionOutcome),
    /// The action failed: a fault of the entity, decided by its fault policy; a
    /// non-retryable failure parks the entity for an operator at once.
    Fail {
        /// What went wrong.
        error: String,
        /// Whether trying again may help.
        retryable: bool,
    },
}

impl TaskResult {
    /// A completion that moves to `target` with these properties set (a `null` removes
    /// one), and nothing else: what most reports are.
    pub fn complete(target: impl AsRef<str>, properties: Properties) -> Self {
        let changes = properties.into_iter().map(|(k, v)| PropChange::from_json(k, v)).collect();
        TaskResult::Complete(ActionOutcome {
            target: Some(StateName::new(target)),
            changes,
            ..ActionOutcome::default()
        })
    }

    /// The task's outcome as stored (`complete` or `fail`), and the error the agent reported.
    pub(crate) fn outcome(&self) -> (&'static str, Option<&str>) {
        match self {
            TaskResult::Complete(_) => ("complete", None),
            TaskResult::Fail { error, .. } => ("fail", Some(error.as_str())),
        }
    }
}

/// An agent report as queued in the entity's inbox ([`InboxKind::Agent`] params).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentReport {
    /// The task.
    pub task: i64,
    /// The state entry (entity version) the task belongs to.
    pub entity_version: i64,
    /// The lease attempt that reported.
    pub attempt: u32,
    /// When that lease began.
    pub leased_at: Millis,
    /// The agent that reported.
    pub agent: Option<String>,
    /// The result.
    pub result: TaskResult,
}

impl AgentReport {
    /// The inbox item that carries this report to the task's entity, `key` of `machine`.
    pub(crate) fn push(&self, machine: String, key: String, request_id: Option<String>) -> Push {
        Push {
            machine: MachineName::new(machine),
            key: EntityKey::new(key),
            event: EventName::new(InboxKind::AGENT_EVENT),
            params: self.to_json(),
            request_id,
            kind: InboxKind::Agent,
            join_from: None,
            operation: None,
            reply: None,
        }
    }

    /// The inbox params encoding.
    pub fn to_json(&self) -> Value {
        let result = match &self.result {
            TaskResult::Complete(outcome) => serde_json::json!({"complete": outcome.to_json()}),
            TaskResult::Fail { error, retryable } => {
                serde_json::json!({"fail": {"error": error, "retryable": retryable}})
            }
        };
        serde_json::json!({
            "task": self.task,
            "entity_version": self.entity_version,
            "attempt": self.attempt,
            "leased_at": self.leased_at,
            "agent": self.agent,
            "result": result,
        })
    }
    /// Decodes [`AgentReport::to_json`]; `None` if it is not one.
    pub fn from_json(v: &Value) -> Option<Self> {
        let result = v.get("result")?;
        let result = if let Some(c) = result.get("complete") {
            match c.get("properties") {
                // As reports were queued before they carried a whole outcome.
                Some(props) => TaskResult::complete(c.get("target")?.as_str()?, props.as_object()?.clone()),
                None => TaskResult::Complete(ActionOutcome::from_json(c).ok()?),
            }
        } else {
            let f = result.get("fail")?;
            TaskResult::Fail { error: f.get("error")?.as_str()?.to_string(), retryable: f.get("retryable")?.as_bool()? }
        };
        Some(AgentReport {
            task: v.get("task")?.as_i64()?,
            entity_version: v.get("entity_version")?.as_i64()?,
            attempt: u32::try_from(v.get("attempt")?.as_u64()?).ok()?,
            leased_at: v.get("leased_at")?.as_i64()?,
            agent: v.get("agent").and_then(Value::as_str).map(str::to_string),
            result,
        })
    }
}

/// Which agent tasks to list.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    /// Only this task.
    pub id: Option<i64>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this entity's tasks.
    pub entity_id: Option<i64>,
    /// Only ready or leased tasks.
    pub open_only: bool,
    /// At most this many, newest first (`None`: all).
    pub limit: Option<u64>,
}

/// What a heartbeat or report must satisfy besides its lease, checked against the task row
/// it reads (so that the row is read once, under lock).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskCheck {
    /// The queues the caller serves; `None`: any.
    pub queues: Option<Vec<String>>,
    /// The agent-run actions, by (machine, action): a completion to a target the action
    /// does not declare, or creating or raising beyond its `may_create` / `may_raise`, is
    /// refused. An action not listed is not checked.
    pub actions: std::sync::Arc<BTreeMap<(String, String), Action>>,
    /// The machines of those actions, by name: the reply a completion asks for and the
    /// events it raises on its own entity must be its own machine's events (these with the
    /// parameters they require). A machine not listed is not checked.
    pub machines: std::sync::Arc<BTreeMap<String, std::sync::Arc<settle_core::Machine>>>,
}

impl TaskCheck {
    /// Whether the caller serves `queue`.
    pub(crate) fn serves(&self, queue: &str) -> bool {
        self.queues.as_ref().is_none_or(|q| q.iter().any(|q| q == queue))
    }
}

/// Why an agent's heartbeat or report was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskRefusal {
    /// The token does not hold the task's lease: it expired or was superseded, or the task
    /// was reported already or canceled.
    #[error("task {task}: {reason}")]
    Refused {
        /// The task.
        task: i64,
        /// Why.
        reason: String,
    },
    /// No agent task has this id.
    #[error("no task {task}")]
    Unknown {
        /// The task.
        task: i64,
    },
    /// The caller does not serve the task's queue ([`TaskCheck::queues`]).
    #[error("task {task} is of queue `{queue}`, which the caller does not serve")]
    QueueForbidden {
        /// The task.
        task: i64,
        /// Its queue.
        queue: String,
    },
    /// The report does not fit the task's action: a target it does not declare, an entity
    /// it may not create, an event it may not raise.
    #[error("task {task}: {field}: {reason}")]
    BadReport {
        /// The task.
        task: i64,
        /// The report's field at fault (`target`, `create[0]`, `raise[1]`, …).
        field: String,
        /// Why.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn report(result: TaskResult) -> AgentReport {
        AgentReport { task: 7, entity_version: 3, attempt: 2, leased_at: 1_000, agent: Some("a-1".into()), result }
    }

    #[test]
    fn a_report_survives_its_encoding() {
        let complete = TaskResult::Complete(ActionOutcome {
            target: None,
            delay: Some(std::time::Duration::from_millis(5)),
            changes: vec![PropChange::Set("k".into(), Value::Null)],
            ..ActionOutcome::default()
        });
        for result in [complete, TaskResult::Fail { error: "quota".into(), retryable: false }] {
            let r = report(result);
            assert_eq!(AgentReport::from_json(&r.to_json()), Some(r.clone()));
        }
        assert_eq!(AgentReport::from_json(&json!({"task": 1})), None, "not a report");
    }

    #[test]
    fn a_report_queued_before_reports_carried_a_whole_outcome_still_reads() {
        let old = json!({
            "task": 7, "entity_version": 3, "attempt": 2, "leased_at": 1_000, "agent": "a-1",
            // (Written in key order: a JSON object's order is not kept by every build.)
            "result": {"complete": {"target": "ready", "properties": {"addr": null, "ip": "10.0.0.7"}}},
        });
        let want = TaskResult::Complete(ActionOutcome {
            target: Some(StateName::new("ready")),
            changes: vec![PropChange::Remove("addr".into()), PropChange::Set("ip".into(), json!("10.0.0.7"))],
            ..ActionOutcome::default()
        });
        assert_eq!(AgentReport::from_json(&old), Some(report(want)));
    }

    #[test]
    fn the_stored_outcome_names_the_kind_and_the_error() {
        assert_eq!(TaskResult::complete("ready", Properties::new()).outcome(), ("complete", None));
        let fail = TaskResult::Fail { error: "quota".into(), retryable: true };
        assert_eq!(fail.outcome(), ("fail", Some("quota")));
    }
}
