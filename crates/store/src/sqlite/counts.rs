//! The SQLite dialect's fleet counts: no trigger keeps them; every write that changes what
//! they count adds its changes here, in its own transaction, once per batch (migrations 0017
//! and 0018): entity counts from the plan's slots, operation outcomes and transitions and
//! errors per minute from what the dialect's statements wrote or returned.

use std::collections::BTreeMap;

use rusqlite::{Connection, params};

use crate::Millis;
use crate::plan::rows::CountDelta;

/// Adds `deltas` to the entity counts on `c` (rows that fall to 0 stay: readers skip them).
pub(super) fn add(c: &Connection, deltas: &[CountDelta]) -> rusqlite::Result<()> {
    let mut stmt = c.prepare_cached(
        "INSERT INTO entity_counts (machine, state, run_status, n) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (machine, state, run_status) DO UPDATE SET n = n + excluded.n",
    )?;
    for d in deltas {
        stmt.execute(params![d.machine, d.state, d.run_status, d.n])?;
    }
    Ok(())
}

/// Changes to `operation_counts` (by outcome, `open` for none) and `minute_counts` (by
/// minute: transitions, errors) gathered while a write runs, then added in one statement per
/// outcome and per minute ([`Tally::flush`]).
#[derive(Debug, Default)]
pub(crate) struct Tally {
    outcomes: Vec<(String, i64)>,
    minutes: BTreeMap<i64, (i64, i64)>,
}

/// The outcome an operation without one is counted under.
const OPEN: &str = "open";

impl Tally {
    /// `n` more operations with `outcome` (`None`: open); `n` may be negative.
    pub(super) fn outcome(&mut self, outcome: Option<&str>, n: i64) {
        let outcome = outcome.unwrap_or(OPEN);
        match self.outcomes.iter_mut().find(|(o, _)| o == outcome) {
            Some((_, m)) => *m += n,
            None => self.outcomes.push((outcome.to_string(), n)),
        }
    }

    /// `n` operations moved from outcome `from` to `to` (`None`: open).
    pub(super) fn moved(&mut self, from: Option<&str>, to: Option<&str>, n: i64) {
        if from != to && n != 0 {
            self.outcome(from, -n);
            self.outcome(to, n);
        }
    }

    /// A transition (a state entered by the workflow) at `at`.
    pub(super) fn transition(&mut self, at: Millis) {
        self.minutes.entry(at / 60_000).or_default().0 += 1;
    }

    /// An error recorded at `at`.
    pub(super) fn error(&mut self, at: Millis) {
        self.minutes.entry(at / 60_000).or_default().1 += 1;
    }

    /// Adds what was gathered to the counts on `c` and starts again from nothing.
    pub(super) fn flush(&mut self, c: &Connection) -> rusqlite::Result<()> {
        if self.outcomes.iter().any(|(_, n)| *n != 0) {
            let mut stmt = c.prepare_cached(
                "INSERT INTO operation_counts (outcome, n) VALUES (?1, ?2)
                 ON CONFLICT (outcome) DO UPDATE SET n = n + excluded.n",
            )?;
            for (outcome, n) in self.outcomes.iter().filter(|(_, n)| *n != 0) {
                stmt.execute(params![outcome, n])?;
            }
        }
        self.outcomes.clear();
        if !self.minutes.is_empty() {
            let mut stmt = c.prepare_cached(
                "INSERT INTO minute_counts (minute, transitions, errors) VALUES (?1, ?2, ?3)
                 ON CONFLICT (minute) DO UPDATE
                 SET transitions = transitions + excluded.transitions, errors = errors + excluded.errors",
            )?;
            for (minute, (transitions, errors)) in &self.minutes {
                stmt.execute(params![minute, transitions, errors])?;
            }
        }
        self.minutes.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_adds_its_changes_once_and_starts_again() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE operation_counts (outcome TEXT PRIMARY KEY, n INTEGER NOT NULL);
             CREATE TABLE minute_counts (minute INTEGER PRIMARY KEY, transitions INTEGER NOT NULL,
                                         errors INTEGER NOT NULL);
             INSERT INTO operation_counts VALUES ('open', 5), ('hung', 1);",
        )
        .unwrap();
        let mut t = Tally::default();
        t.outcome(None, 3);
        t.moved(None, Some("success"), 1);
        t.moved(Some("hung"), Some("failed"), 1);
        t.moved(Some("success"), Some("success"), 1);
        t.moved(None, Some("canceled"), 0);
        t.outcome(Some("failed"), -1);
        t.transition(120_000);
        t.transition(179_999);
        t.transition(180_000);
        t.error(120_001);
        t.flush(&c).unwrap();
        t.flush(&c).unwrap();
        let rows = |sql: &str| -> Vec<String> {
            let mut s = c.prepare(sql).unwrap();
            s.query_map([], |r| Ok(format!("{}={}", r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        };
        assert_eq!(rows("SELECT outcome, n FROM operation_counts ORDER BY outcome"), ["hung=0", "open=7", "success=1"]);
        assert_eq!(
            rows("SELECT minute || ':' || transitions, errors FROM minute_counts ORDER BY minute"),
            ["2:2=1", "3:1=0"]
        );
    }
}
