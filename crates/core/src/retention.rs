//! How long the store keeps what entities leave behind: [`Keep`] (a duration, or
//! `forever`), a machine's declared retention ([`Retention`]) and the deployment's defaults
//! ([`Defaults`]) that fill in what a machine does not declare.
//!
//! A machine declares how long an entity stays after it enters one of its end states
//! (terminal or deleted): for every end state at once (`[retention] ended = "30d"`), or for
//! one of them (`retain = "90d"` on the state: keep `failed` longer than `deleted`). The
//! deployment says the rest (`--retention ended=30d,operations=7d,…`): the default for
//! end states, how long ended operations (and with them the replay window of a request
//! id), finished agent tasks and per-minute counts are kept. Live entities are never
//! removed; what they keep of their past is [`History`]: their history rows, processed
//! events and errors, by age and/or count (`[retention] history = "90d"`,
//! `history_rows = 1000`; the deployment's `history`), the latest always kept. Pure: the
//! engine turns a policy into cut-off times on its clock.

use std::time::Duration;

use crate::duration;

/// How long something is kept: for a duration after it ended, or forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Keep {
    /// Kept this long (measured from when the entity entered its end state, the operation
    /// ended, the task finished, the minute passed).
    For(Duration),
    /// Never removed.
    Forever,
}

impl Keep {
    /// Reads `forever` or a duration such as `30d` or `12h`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use settle_core::retention::Keep;
    /// assert_eq!(Keep::parse("7d"), Ok(Keep::For(Duration::from_secs(7 * 86_400))));
    /// assert_eq!(Keep::parse("forever"), Ok(Keep::Forever));
    /// assert!(Keep::parse("a while").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Keep, String> {
        if text.trim() == "forever" {
            return Ok(Keep::Forever);
        }
        duration::parse(text).map(Keep::For).map_err(|e| format!("{e}, or `forever`"))
    }

    /// The text [`Keep::parse`] reads back: `forever` or the shortest duration.
    pub fn as_text(&self) -> String {
        match self {
            Keep::For(d) => duration::format(*d),
            Keep::Forever => "forever".to_string(),
        }
    }

    /// What ended before this time (milliseconds, on the caller's clock) is past its
    /// retention at `now`; `None` when kept forever.
    pub fn cutoff(&self, now: i64) -> Option<i64> {
        match self {
            Keep::For(d) => Some(now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))),
            Keep::Forever => None,
        }
    }

    /// As stored in a definition's canonical JSON: milliseconds, or `"forever"`.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Keep::For(d) => serde_json::Value::from(d.as_millis() as u64),
            Keep::Forever => serde_json::Value::from("forever"),
        }
    }

    /// Reads [`Keep::to_json`] back.
    pub fn from_json(v: &serde_json::Value) -> Option<Keep> {
        match v {
            serde_json::Value::String(s) if s == "forever" => Some(Keep::Forever),
            v => v.as_u64().map(|ms| Keep::For(Duration::from_millis(ms))),
        }
    }
}

/// A machine's retention as declared (`[retention]`); what it leaves out, the deployment's
/// [`Defaults`] say. The per-state `retain` is the state's own ([`crate::State::retain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    /// `ended`: how long an entity stays after entering any end state of the machine
    /// that declares no `retain` of its own.
    pub ended: Option<Keep>,
    /// `archive`: whether an entity removed by retention is first written to the
    /// deployment's archive (JSON Lines, one object per entity with its history, events
    /// and errors). `None`: as the deployment says (archived when it has an archive).
    pub archive: Option<bool>,
    /// `history`: how long a live entity keeps a row of its history, processed events and
    /// errors (`None`: as the deployment says).
    pub history: Option<Keep>,
    /// `history_rows`: at most this many of each (the latest); `None`: no count.
    pub history_rows: Option<u32>,
}

/// What a live entity keeps of its past: its history rows, processed events and errors
/// younger than `age` and among its latest `rows` of each; its latest row of each, and the
/// event of the workflow it is in, whatever their age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct History {
    /// Rows older than this go.
    pub age: Keep,
    /// Rows beyond the latest this many go.
    pub rows: Option<u32>,
}

impl History {
    /// Whether everything is kept (nothing to trim).
    pub fn keeps_all(&self) -> bool {
        self.age == Keep::Forever && self.rows.is_none()
    }
}

/// The deployment's retention: what a machine does not declare, and what belongs to no
/// machine (operations reach several; tasks and per-minute counts are the deployment's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// How long an entity stays after entering an end state (`ended`).
    pub ended: Keep,
    /// How long an ended operation is kept (`operations`): also the window in which its
    /// request id is answered as a replay; after it, the same id starts a new operation.
    pub operations: Keep,
    /// How long a finished agent task is kept (`tasks`).
    pub tasks: Keep,
    /// How long a minute's counts of transitions and errors are kept (`minutes`).
    pub minutes: Keep,
    /// How long a live entity keeps a row of its history, events and errors (`history`),
    /// where its machine does not say.
    pub history: Keep,
}

const DAY: u64 = 86_400;

impl Defaults {
    /// What a deployment keeps unless told otherwise: ended entities 30 days, ended
    /// operations (the replay window) and finished tasks 7 days, per-minute counts 30 days.
    pub const BUILT_IN: Defaults = Defaults {
        ended: Keep::For(Duration::from_secs(30 * DAY)),
        operations: Keep::For(Duration::from_secs(7 * DAY)),
        tasks: Keep::For(Duration::from_secs(7 * DAY)),
        minutes: Keep::For(Duration::from_secs(30 * DAY)),
        history: Keep::Forever,
    };

    /// Everything kept forever: the behaviour before retention existed.
    pub const FOREVER: Defaults = Defaults {
        ended: Keep::Forever,
        operations: Keep::Forever,
        tasks: Keep::Forever,
        minutes: Keep::Forever,
        history: Keep::Forever,
    };

    /// These defaults with the entries of `spec` applied: comma-separated `name=keep`
    /// (`ended=7d,operations=1d,tasks=forever,minutes=30d,history=90d`); names not given keep their
    /// value. An unknown name, a missing `=` or a bad duration is an error naming it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use settle_core::retention::{Defaults, Keep};
    /// let d = Defaults::BUILT_IN.with("ended=1h, operations=forever").unwrap();
    /// assert_eq!(d.ended, Keep::For(Duration::from_secs(3600)));
    /// assert_eq!(d.operations, Keep::Forever);
    /// assert_eq!(d.tasks, Defaults::BUILT_IN.tasks);
    /// assert!(Defaults::BUILT_IN.with("logs=1d").unwrap_err().contains("unknown retention `logs`"));
    /// ```
    pub fn with(mut self, spec: &str) -> Result<Defaults, String> {
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let Some((name, value)) = entry.split_once('=') else {
                return Err(format!("retention `{entry}`: expected `name=duration` (e.g. `ended=30d`)"));
            };
            let (name, value) = (name.trim(), value.trim());
            let keep = Keep::parse(value).map_err(|e| format!("retention `{name}`: {e}"))?;
            match name {
                "ended" => self.ended = keep,
                "operations" => self.operations = keep,
                "tasks" => self.tasks = keep,
                "minutes" => self.minutes = keep,
                "history" => self.history = keep,
                _ => {
                    return Err(format!(
                        "unknown retention `{name}` (expected `ended`, `operations`, `tasks`, `minutes` or `history`)"
                    ));
                }
            }
        }
        Ok(self)
    }

    /// The spec [`Defaults::with`] reads back, every entry written.
    pub fn as_text(&self) -> String {
        format!(
            "ended={},operations={},tasks={},minutes={},history={}",
            self.ended.as_text(),
            self.operations.as_text(),
            self.tasks.as_text(),
            self.minutes.as_text(),
            self.history.as_text()
        )
    }
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults::BUILT_IN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keep_reads_back_what_it_writes_and_cuts_off_on_the_callers_clock() {
        for text in ["forever", "90d", "1h30m", "0s"] {
            assert_eq!(Keep::parse(text).unwrap().as_text(), text);
            let k = Keep::parse(text).unwrap();
            assert_eq!(Keep::from_json(&k.to_json()), Some(k));
        }
        assert_eq!(Keep::For(Duration::from_secs(10)).cutoff(60_000), Some(50_000));
        assert_eq!(Keep::Forever.cutoff(60_000), None);
        assert!(Keep::parse("soon").unwrap_err().contains("or `forever`"));
    }

    #[test]
    fn deployment_defaults_take_a_spec_and_name_what_is_wrong() {
        let d = Defaults::BUILT_IN.with("minutes=1d,tasks=forever").unwrap();
        assert_eq!(d.minutes, Keep::For(Duration::from_secs(DAY)));
        assert_eq!(d.tasks, Keep::Forever);
        assert_eq!(d.ended, Defaults::BUILT_IN.ended);
        assert_eq!(Defaults::BUILT_IN.with(&d.as_text()), Ok(d));
        assert_eq!(Defaults::BUILT_IN.with(""), Ok(Defaults::BUILT_IN));
        assert_eq!(
            Defaults::BUILT_IN.with("ended").unwrap_err(),
            "retention `ended`: expected `name=duration` (e.g. `ended=30d`)"
        );
        assert!(
            Defaults::BUILT_IN.with("ended=30 days").unwrap_err().starts_with("retention `ended`: invalid duration")
        );
    }
}
