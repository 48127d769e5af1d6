//! The warnings of [`check`](super::check): what a definition accepts but probably does
//! not mean, found on its transition graph — states unreachable from the initial state,
//! stable states no event leaves, busy loops of unstable states, and timers that can raise
//! nothing useful.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::{Checker, quoted};
use crate::machine::def::{StateDef, StateKind, effective_kind};

impl<'a> Checker<'a> {
    /// Timers that can never raise anything useful: running in no state, or raising an
    /// event valid in none of their states (the event would always be rejected).
    pub(super) fn idle_timers(&mut self) {
        for t in &self.def.timers {
            let item = format!("timer `{}`", t.name);
            if t.valid_in.is_empty() {
                self.warning(&item, t.origin.line, "runs in no state (`in` is empty)".into());
            } else if let Some(e) = self.events.get(t.event.as_str())
                && !t.valid_in.iter().any(|s| e.valid_in.contains(s))
            {
                let message =
                    format!("timer `{}` raises `{}`, which is not valid in any of its states", t.name, t.event);
                self.warning(&item, t.origin.line, message);
            }
        }
    }

    /// Edges of the transition graph out of `s`: the leaves entered by the targets of the
    /// events valid in it (declared for it or an ancestor) and, for unstable states, of its
    /// auto action. Unknown names are skipped.
    fn successors(&self, s: &'a StateDef) -> Vec<&'a str> {
        let mut out = Vec::new();
        let mut add = |action: &str| {
            if let Some(a) = self.actions.get(action) {
                out.extend(a.targets.iter().map(String::as_str).filter(|t| self.has_state(t)).map(|t| self.descend(t)));
            }
        };
        let path = self.path(&s.name);
        for e in self.def.events.iter().filter(|e| path.iter().any(|p| e.valid_in.iter().any(|v| v == p))) {
            for a in std::iter::once(&e.action).chain(e.when.iter().filter_map(|w| w.action.as_ref())) {
                add(a);
            }
        }
        if effective_kind(s) == StateKind::Unstable {
            for a in &s.auto {
                add(a);
            }
        }
        out
    }

    pub(super) fn unreachable(&mut self) {
        if self.initials.is_empty() {
            return;
        }
        let mut reached: HashSet<&str> = HashSet::new();
        let mut todo: Vec<&str> = self.initials.iter().map(|i| self.descend(i)).collect();
        reached.extend(todo.iter().copied());
        while let Some(name) = todo.pop() {
            for next in self.successors(self.states[name]) {
                if reached.insert(next) {
                    todo.push(next);
                }
            }
        }
        // An entity in a leaf is in every ancestor of it too.
        let leaves: Vec<&str> = reached.iter().copied().collect();
        for leaf in leaves {
            reached.extend(self.path(leaf));
        }
        let from = quoted(self.initials.iter().copied());
        let mut reported = HashSet::new();
        for s in &self.def.states {
            if !reached.contains(s.name.as_str()) && reported.insert(s.name.as_str()) {
                self.warning(
                    &format!("state `{}`", s.name),
                    s.origin.line,
                    format!("unreachable from the initial state {from}"),
                );
            }
        }
    }

    pub(super) fn dead_ends(&mut self) {
        let mut reported = HashSet::new();
        for s in &self.def.states {
            let path = self.path(&s.name);
            let left = self.def.events.iter().any(|e| path.iter().any(|p| e.valid_in.iter().any(|v| v == p)));
            let leaf = !self.is_parent(&s.name);
            if leaf && effective_kind(s) == StateKind::Stable && !left && reported.insert(s.name.as_str()) {
                self.warning(
                    &format!("state `{}`", s.name),
                    s.origin.line,
                    "no event leaves this stable state (declare `kind = \"terminal\"` if that is intended)".into(),
                );
            }
        }
    }

    /// Cycles of two or more unstable states whose auto actions lead to each other with no
    /// wait anywhere: each strongly connected component (of two states or more) of the
    /// graph of unstable states without a `wait`, linked by auto-action targets without a
    /// transition wait, is reported once. Self-loops are retries, not busy loops.
    pub(super) fn busy_loops(&mut self) {
        let zero = |d: Option<Duration>| d.is_none_or(|d| d.is_zero());
        let nodes: Vec<&'a StateDef> = {
            let mut seen = HashSet::new();
            self.def
                .states
                .iter()
                .filter(|s| effective_kind(s) == StateKind::Unstable && zero(s.wait) && seen.insert(s.name.as_str()))
                .collect()
        };
        let index: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
        let edges: Vec<Vec<usize>> = nodes
            .iter()
            .map(|s| {
                s.auto
                    .iter()
                    .filter_map(|a| self.actions.get(a.as_str()))
                    .flat_map(|a| {
                        a.targets.iter().filter(|t| {
                            let wait = a.target_waits.iter().find(|(w, _)| w == *t).map(|(_, d)| *d);
                            **t != s.name && zero(wait)
                        })
                    })
                    .filter_map(|t| index.get(self.descend(t)).copied())
                    .collect()
            })
            .collect();
        let reach: Vec<Vec<bool>> = (0..nodes.len())
            .map(|from| {
                let mut seen = vec![false; nodes.len()];
                let mut todo = vec![from];
                while let Some(n) = todo.pop() {
                    for &m in &edges[n] {
                        if !seen[m] {
                            seen[m] = true;
                            todo.push(m);
                        }
                    }
                }
                seen
            })
            .collect();
        let mut done = vec![false; nodes.len()];
        for i in 0..nodes.len() {
            if done[i] {
                continue;
            }
            let component: Vec<usize> = (0..nodes.len()).filter(|&j| j == i || (reach[i][j] && reach[j][i])).collect();
            for &j in &component {
                done[j] = true;
            }
            if component.len() > 1 {
                let list = quoted(component.iter().map(|&j| nodes[j].name.as_str()));
                self.warning(
                    "machine",
                    nodes[i].origin.line,
                    format!("busy loop: unstable states {list} lead to each other with no wait"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::fixtures::{base, messages};
    use crate::machine::{MachineBuilder, Schedule, StateKind};

    #[test]
    fn warns_about_unreachable_states() {
        let def = base()
            .state("orphan")
            .state("lost")
            .auto("work")
            .event("leave", ["orphan"], "start")
            .action("never", ["lost"])
            .def()
            .clone();
        assert_eq!(
            messages(&def),
            [
                "warning: machine `m`, state `orphan`: unreachable from the initial state `idle`",
                "warning: machine `m`, state `lost`: unreachable from the initial state `idle`",
            ]
        );
    }

    #[test]
    fn warns_about_stable_states_no_event_leaves() {
        let mut def = base().state("stuck").state("done").kind(StateKind::Terminal).def().clone();
        def.actions[1].targets.extend(["stuck".to_string(), "done".to_string()]);
        assert_eq!(
            messages(&def),
            [
                "warning: machine `m`, state `stuck`: no event leaves this stable state (declare `kind = \"terminal\"` if that is intended)"
            ]
        );
    }

    #[test]
    fn warns_about_busy_loops() {
        // a -> b -> c -> a with no wait; d -> d is a retry, not a busy loop.
        let looped = |b: MachineBuilder| {
            b.state("a")
                .auto("fa")
                .state("b")
                .auto("fb")
                .state("c")
                .auto("fc")
                .state("d")
                .auto("fd")
                .event("enter", ["idle"], "into")
                .action("into", ["a", "d"])
                .action("fa", ["b", "idle"])
                .action("fb", ["c"])
                .action("fc", ["a"])
                .action("fd", ["d", "idle"])
        };
        let mut def = looped(base()).def().clone();
        def.states[2].origin.line = Some(7);
        assert_eq!(
            messages(&def),
            [
                "line 7: warning: machine `m`, machine: busy loop: unstable states `a`, `b`, `c` lead to each other with no wait"
            ]
        );
        // A wait on any state of the loop breaks it ...
        let mut waits = def.clone();
        waits.states[4].wait = Some(Duration::from_millis(10));
        assert_eq!(messages(&waits), Vec::<String>::new());
        // ... and so does a wait on any transition of it.
        let mut waits = def.clone();
        waits
            .actions
            .iter_mut()
            .find(|a| a.name == "fc")
            .unwrap()
            .target_waits
            .push(("a".into(), Duration::from_secs(1)));
        assert_eq!(messages(&waits), Vec::<String>::new());
        // A zero wait is no wait.
        let mut zero = def.clone();
        zero.states[4].wait = Some(Duration::ZERO);
        assert_eq!(messages(&zero).len(), 1);
    }

    #[test]
    fn warns_about_timers_that_raise_nothing_useful() {
        let mut def = base()
            .event("tick", ["busy"], "start")
            .timer("poll", "tick", Schedule::Every(Duration::from_secs(60)), ["idle"])
            .timer("nowhere", "tick", Schedule::After(Duration::from_secs(1)), Vec::<String>::new())
            .timer("fine", "tick", Schedule::Every(Duration::from_secs(60)), ["idle", "busy"])
            .def()
            .clone();
        def.timers[0].origin.line = Some(40);
        assert_eq!(
            messages(&def),
            [
                "line 40: warning: machine `m`, timer `poll`: timer `poll` raises `tick`, which is not valid in any of its states",
                "warning: machine `m`, timer `nowhere`: runs in no state (`in` is empty)",
            ]
        );
    }

    #[test]
    fn states_left_by_subscriptions_or_timers_are_no_dead_ends() {
        // `waiting` is left only by a subscription event, `ready` only by a timer's event.
        let def = base()
            .state("waiting")
            .state("ready")
            .event("wait", ["idle"], "park")
            .event("children_ready", ["waiting"], "finish")
            .subscribe("all(*) in [ready]")
            .event("check", ["ready"], "start")
            .timer("health", "check", Schedule::Every(Duration::from_secs(300)), ["ready"])
            .action("park", ["waiting"])
            .action("finish", ["ready"])
            .def()
            .clone();
        assert_eq!(messages(&def), Vec::<String>::new());
    }
}
