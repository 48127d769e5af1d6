//! Every agent report is answered as the protocol says ([`Agents`]): applied when its
//! token holds the task's live lease; a replay when its token's report was applied before;
//! refused otherwise, for the reason that holds — another lease reported, the token was
//! superseded by a later lease, the lease expired (or the task was offered again), the
//! task was canceled.
//!
//! The model keeps what the agents were answered, in the order the batches applied it:
//! each lease (token, attempt, end), each report applied. It knows nothing of the entity's
//! transitions, so a refusal as canceled is checked against the task as stored after the
//! batch. An answer lost with its batch (a store fault) leaves the task as the model cannot
//! know it: it takes the stored row after the batch instead.

use std::collections::HashMap;

use settle_store::AgentTask;

/// How a report was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Applied: queued for the entity.
    Applied,
    /// A replay of this token's applied report.
    Replayed,
    /// Refused, with the store's reason.
    Refused(String),
}

/// The reasons a report is refused for, by the start of the store's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    AlreadyReported,
    Superseded,
    Expired,
    NotLeased,
    Canceled,
}

impl Why {
    fn of(reason: &str) -> Option<Why> {
        [
            ("already reported", Why::AlreadyReported),
            ("lease token superseded", Why::Superseded),
            ("lease expired", Why::Expired),
            ("not leased", Why::NotLeased),
            ("canceled", Why::Canceled),
        ]
        .into_iter()
        .find(|(prefix, _)| reason.starts_with(prefix))
        .map(|(_, w)| w)
    }
}

/// One lease an agent was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Lease {
    token: String,
    locked_until: i64,
}

/// What the agents know of a task.
#[derive(Debug, Default, Clone)]
struct Task {
    /// Its entity, `machine/key`.
    entity: String,
    leases: Vec<Lease>,
    /// The token whose report was applied.
    reported: Option<String>,
}

/// The task as stored (after a batch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) status: String,
    pub(crate) token: Option<String>,
    pub(crate) locked_until: Option<i64>,
}

/// The agents' model.
#[derive(Debug, Default)]
pub(crate) struct Agents {
    tasks: HashMap<i64, Task>,
    /// Reports checked.
    pub(crate) reports: u64,
}

impl Agents {
    /// Tasks a lease was answered with.
    pub(crate) fn leased(&mut self, tasks: &[AgentTask]) {
        for t in tasks {
            if let (Some(token), Some(locked_until)) = (&t.token, t.locked_until) {
                let task = self.tasks.entry(t.id).or_default();
                task.entity = format!("{}/{}", t.machine, t.key);
                task.leases.push(Lease { token: token.clone(), locked_until });
            }
        }
    }

    /// The entity of `task` (`machine/key`), if a lease named it.
    pub(crate) fn entity(&self, task: i64) -> Option<String> {
        self.tasks.get(&task).map(|t| t.entity.clone()).filter(|e| !e.is_empty())
    }

    /// An operation on `task` whose answer was lost with its batch: the task is as stored
    /// after it (`None`: as before, the batch did not reach the store).
    pub(crate) fn lost(&mut self, task: i64, stored: Option<&Stored>) {
        let Some(s) = stored else { return };
        let t = self.tasks.entry(task).or_default();
        if let (Some(token), Some(locked_until)) = (&s.token, s.locked_until)
            && t.leases.last().is_none_or(|l| l.token != *token)
        {
            t.leases.push(Lease { token: token.clone(), locked_until });
        }
        if s.status == "done" {
            t.reported = s.token.clone();
        }
    }

    /// A report on `task` with `token` applied at `now` was answered `answer`; the task is
    /// `stored` after the batch. `Err` says what the protocol answers instead.
    pub(crate) fn reported(
        &mut self,
        task: i64,
        token: &str,
        now: i64,
        answer: &Answer,
        stored: Option<&Stored>,
    ) -> Result<(), String> {
        self.reports += 1;
        let t = self.tasks.entry(task).or_default();
        let expected: Vec<Answer> = match (&t.reported, t.leases.last()) {
            (Some(done), _) if done == token => vec![Answer::Replayed],
            (Some(_), _) => vec![refused("already reported")],
            (None, Some(latest)) if latest.token != token => {
                let mut e = vec![refused("lease token superseded")];
                if now >= latest.locked_until {
                    e.push(refused("not leased"));
                }
                e
            }
            (None, Some(latest)) if now >= latest.locked_until => vec![refused("lease expired"), refused("not leased")],
            (None, Some(_)) => vec![Answer::Applied],
            (None, None) => vec![refused("not leased")],
        };
        let why = |a: &Answer| match a {
            Answer::Refused(r) => Why::of(r),
            _ => None,
        };
        let canceled = why(answer) == Some(Why::Canceled) && stored.is_some_and(|s| s.status == "canceled");
        let fits = canceled
            || expected.iter().any(|e| match (e, answer) {
                (Answer::Refused(_), Answer::Refused(_)) => why(e) == why(answer) && why(e).is_some(),
                _ => e == answer,
            });
        if !fits {
            let known = t.leases.iter().map(|l| format!("{}..{}", l.token, l.locked_until)).collect::<Vec<_>>();
            return Err(format!(
                "task {task}: a report with token {token} at {now} was answered {answer:?}, but the protocol answers \
                 {} (leases answered: {known:?}; report applied: {:?}; stored after the batch: {stored:?})",
                expected.iter().map(|e| format!("{e:?}")).collect::<Vec<_>>().join(" or "),
                t.reported
            ));
        }
        if *answer == Answer::Applied {
            if let Some(s) = stored
                && s.status != "done"
            {
                return Err(format!("task {task}: a report with token {token} was applied, but the task is {s:?}"));
            }
            t.reported = Some(token.to_string());
        }
        Ok(())
    }
}

fn refused(reason: &str) -> Answer {
    Answer::Refused(reason.to_string())
}
