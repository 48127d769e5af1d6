//! Deploying a version to live entities: which move to it now, which keep the version they
//! run under until they rest (`pin`), and which it would strand.
//!
//! Pure, like [`check`](super::check): the engine gives it the entities' versions and
//! states with their counts, and applies the moves it returns.

use std::collections::{BTreeMap, BTreeSet};

use super::{Policy, UpgradeRefused};
use crate::machine::Machine;
use crate::names::StateName;

/// Live entities of one machine in one state under one version.
#[derive(Debug, Clone, Copy)]
pub struct Occupied<'a> {
    /// The version they run under (its hash; empty: none recorded).
    pub hash: &'a str,
    /// That version's definition, when known (else the entities count as at rest).
    pub version: Option<&'a Machine>,
    /// The state they are in.
    pub state: &'a str,
    /// How many.
    pub count: u64,
}

/// Entities moving to the new version: those under `hash` in `from` go to `to` (the same
/// name when the state stays).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The version they leave (empty: none recorded).
    pub hash: String,
    /// The state they are in.
    pub from: String,
    /// The state they land in, a leaf of the new version.
    pub to: String,
    /// How many.
    pub count: u64,
}

/// What deploying a version does to the live entities of its machine.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Entities that move now.
    pub moves: Vec<Move>,
    /// Entities that keep their version until they rest (`pin`): version, state, count.
    pub pinned: Vec<(String, String, u64)>,
}

/// Plans the deploy of `new` (with content hash `new_hash`) over the live entities
/// `occupied` of its machine. Entities already under `new_hash` stay as they are.
///
/// With [`Policy::Migrate`] every other entity moves now: its state must have a home in
/// `new` (declared, or mapped by `renamed_from` / `[migrate]`; a parent's entities land in
/// its initial leaf). With [`Policy::Pin`] entities at rest in their version (a stable,
/// terminal or deleted state) move now the same way; entities working in an unstable
/// state stay pinned, and every state their version lets them come to rest in (through
/// auto actions and events, across unstable states) must have a home, so that they can
/// move once they rest.
///
/// Errors: [`UpgradeRefused`] with every state without a home, and its count.
pub fn plan(new: &Machine, new_hash: &str, occupied: &[Occupied<'_>]) -> Result<Plan, UpgradeRefused> {
    let mapping = new.state_mapping();
    let mut plan = Plan::default();
    let mut unmapped: Vec<(String, u64)> = Vec::new();
    let mut would_rest: Vec<(String, String, u64)> = Vec::new();
    for o in occupied.iter().filter(|o| o.count > 0 && o.hash != new_hash) {
        let working = o.version.and_then(|v| v.state(o.state)).is_some_and(|s| !s.at_rest());
        if working && new.upgrade() == Policy::Pin {
            let version = o.version.expect("a working state is a known version's");
            for rest in rests(version, o.state) {
                if home_in(new, &mapping, &rest).is_none() {
                    match would_rest.iter_mut().find(|(s, r, _)| s == o.state && *r == rest) {
                        Some((_, _, n)) => *n = n.saturating_add(o.count),
                        None => would_rest.push((o.state.to_string(), rest, o.count)),
                    }
                }
            }
            plan.pinned.push((o.hash.to_string(), o.state.to_string(), o.count));
            continue;
        }
        match home_in(new, &mapping, o.state) {
            Some(to) => plan.moves.push(Move {
                hash: o.hash.to_string(),
                from: o.state.to_string(),
                to: to.to_string(),
                count: o.count,
            }),
            None => add(&mut unmapped, o.state.to_string(), o.count),
        }
    }
    if unmapped.is_empty() && would_rest.is_empty() {
        Ok(plan)
    } else {
        Err(UpgradeRefused { machine: new.name().clone(), unmapped, would_rest })
    }
}

/// Where an entity in `state` (of an older version) lands in `new`: the state itself or
/// the one `new` maps it to (`renamed_from`, `[migrate]`), descended to a leaf; `None`:
/// `new` has no home for it.
pub fn home(new: &Machine, state: &str) -> Option<StateName> {
    home_in(new, &new.state_mapping(), state).cloned()
}

/// [`home`] with the mapping built once.
fn home_in<'m>(new: &'m Machine, mapping: &'m BTreeMap<StateName, StateName>, state: &str) -> Option<&'m StateName> {
    let target = match new.state(state) {
        Some(s) => &s.name,
        None => mapping.get(state)?,
    };
    Some(&new.descend(target).name)
}

/// The states at rest an entity working in `state` can come to in `machine`: through its
/// auto actions and events, across unstable states, to the first stable, terminal or
/// deleted leaf.
pub fn rests(machine: &Machine, state: &str) -> BTreeSet<String> {
    let edges = crate::edges::edges(machine);
    let (mut seen, mut queue, mut out) = (BTreeSet::new(), vec![state.to_string()], BTreeSet::new());
    while let Some(s) = queue.pop() {
        if !seen.insert(s.clone()) {
            continue;
        }
        for e in edges.iter().filter(|e| machine.is_in(&s, e.from)) {
            let to = machine.descend(e.to);
            if to.at_rest() {
                out.insert(to.name.to_string());
            } else {
                queue.push(to.name.to_string());
            }
        }
    }
    out
}

/// Adds `count` to `key`'s entry, keeping first-appearance order.
fn add(list: &mut Vec<(String, u64)>, key: String, count: u64) {
    match list.iter_mut().find(|(k, _)| *k == key) {
        Some((_, n)) => *n = n.saturating_add(count),
        None => list.push((key, count)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StateKind;
    use crate::machine::MachineBuilder;

    /// v1: new → provisioning (auto) → ready | parked; ready --retire--> gone.
    fn v1() -> Machine {
        MachineBuilder::new("server")
            .state("new")
            .initial()
            .state("provisioning")
            .auto("provision")
            .state("ready")
            .state("parked")
            .state("gone")
            .kind(StateKind::Terminal)
            .event("create", ["new"], "begin")
            .event("retire", ["ready"], "retire")
            .action("begin", ["provisioning"])
            .action("provision", ["ready", "parked"])
            .action("retire", ["gone"])
            .build()
            .unwrap()
    }

    /// v2 renames `ready` to `running`, drops `parked` (mapping it to `running` when
    /// `map_parked`), pins when `pin`.
    fn v2(pin: bool) -> Machine {
        v2_with(pin, false)
    }

    fn v2_with(pin: bool, map_parked: bool) -> Machine {
        let b = MachineBuilder::new("server")
            .state("new")
            .initial()
            .state("provisioning")
            .auto("provision")
            .state("running")
            .renamed_from(["ready"])
            .state("gone")
            .kind(StateKind::Terminal)
            .event("create", ["new"], "begin")
            .event("retire", ["running"], "retire")
            .action("begin", ["provisioning"])
            .action("provision", ["running"])
            .action("retire", ["gone"]);
        let b = if pin { b.upgrade(Policy::Pin) } else { b };
        let b = if map_parked { b.migrate("parked", "running") } else { b };
        b.build().unwrap()
    }

    fn at<'a>(v: &'a Machine, hash: &'a str, state: &'a str, count: u64) -> Occupied<'a> {
        Occupied { hash, version: Some(v), state, count }
    }

    #[test]
    fn the_policy_is_a_key_of_the_version() {
        assert_eq!(v1().upgrade(), Policy::Migrate);
        let pinned = v2(true);
        assert_eq!(pinned.upgrade(), Policy::Pin);
        assert_ne!(pinned.content_hash(), v2(false).content_hash());
        assert!(pinned.to_toml().contains("upgrade = \"pin\"\n"));
        let (back, _) = crate::toml::load("server.toml", "server", &pinned.to_toml()).unwrap();
        assert_eq!(back.content_hash(), pinned.content_hash());
        let json = Machine::from_canonical_json(&pinned.canonical_json()).unwrap();
        assert_eq!(json.upgrade(), Policy::Pin);
        let bad = "initial = \"a\"\nupgrade = \"later\"\n[states.a]\n";
        let err = crate::toml::load("m.toml", "m", bad).unwrap_err();
        assert!(err.to_string().contains("`upgrade` is `later`: `pin` or `migrate`"), "{err}");
    }

    #[test]
    fn migrate_moves_everyone_now_and_names_what_has_no_home() {
        let (old, new) = (v1(), v2(false));
        let h = new.content_hash();
        let live = [at(&old, "h1", "provisioning", 4), at(&old, "h1", "ready", 2), at(&new, &h, "running", 7)];
        let p = plan(&new, &h, &live).unwrap();
        assert_eq!(p.pinned, vec![]);
        let moved: Vec<_> = p.moves.iter().map(|m| (m.from.as_str(), m.to.as_str(), m.count)).collect();
        assert_eq!(moved, [("provisioning", "provisioning", 4), ("ready", "running", 2)]);
        let err = plan(&new, &h, &[at(&old, "h1", "parked", 3)]).unwrap_err();
        assert_eq!(err.unmapped, [("parked".to_string(), 3)]);
    }

    #[test]
    fn pin_keeps_working_entities_and_checks_where_they_may_rest() {
        let (old, new) = (v1(), v2(true));
        let h = new.content_hash();
        // Provisioning entities may rest in `parked`, which v2 has no state for.
        let err = plan(&new, &h, &[at(&old, "h1", "provisioning", 4), at(&old, "h1", "ready", 1)]).unwrap_err();
        assert_eq!(err.unmapped, []);
        assert_eq!(err.would_rest, [("provisioning".to_string(), "parked".to_string(), 4)]);
        assert_eq!(
            err.to_string(),
            "machine `server`: the new definition has no state for `parked`, where 4 pinned entities working in \
             `provisioning` may come to rest (declare `renamed_from` on a state or a `[migrate]` entry)"
        );
        // Mapped: the working ones stay pinned, the resting ones move now.
        let new = v2_with(true, true);
        let h = new.content_hash();
        let p = plan(&new, &h, &[at(&old, "h1", "provisioning", 4), at(&old, "h1", "ready", 1)]).unwrap();
        assert_eq!(p.pinned, [("h1".to_string(), "provisioning".to_string(), 4)]);
        assert_eq!(p.moves, [Move { hash: "h1".into(), from: "ready".into(), to: "running".into(), count: 1 }]);
    }

    #[test]
    fn rests_cross_unstable_states_and_stop_at_the_first_rest() {
        let m = v1();
        assert_eq!(rests(&m, "provisioning"), BTreeSet::from(["parked".to_string(), "ready".to_string()]));
        assert_eq!(rests(&m, "ready"), BTreeSet::from(["gone".to_string()]));
    }
}
