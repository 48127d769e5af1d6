//! Definition upgrades: may a new definition of a machine replace the stored one, given
//! the states its stored entities are in?
//!
//! Every stored entity must land in a state the new definition declares: either its state
//! is still declared (it stays), or the new definition maps the old name to a declared
//! state, by `renamed_from` on that state or by an entry of the `[migrate]` table
//! ([`Machine::state_mapping`]); its entities then move there. Otherwise the upgrade is
//! refused, naming every state left without a home and how many entities are in it.
//!
//! Substates map like states. An entity is always in a leaf: where the state it is in (or
//! the one it is mapped to) has become a parent, it moves on to that parent's initial leaf
//! ([`Machine::descend`]). A move is not a transition: no entry or exit action runs.
//!
//! The check is pure: the engine gives it the stored entities' states with their counts,
//! and applies the moves it returns.
//!
//! ```
//! use settle_core::MachineBuilder;
//! let new = MachineBuilder::new("server")
//!     .state("new").initial()
//!     .state("setting_up").renamed_from(["provisioning"])
//!     .state("ready").kind(settle_core::StateKind::Terminal)
//!     .event("create", ["new"], "begin")
//!     .event("finish", ["setting_up"], "done")
//!     .action("begin", ["setting_up"])
//!     .action("done", ["ready"])
//!     .migrate("configuring", "setting_up")
//!     .build()
//!     .unwrap();
//! let occupied = [("new".to_string(), 4), ("provisioning".to_string(), 12), ("configuring".to_string(), 3)];
//! assert_eq!(
//!     settle_core::upgrade::check(&new, &occupied).unwrap(),
//!     [("provisioning".to_string(), "setting_up".to_string(), 12), ("configuring".into(), "setting_up".into(), 3)]
//! );
//! let err = settle_core::upgrade::check(&new, &[("deleting".to_string(), 1)]).unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "machine `server`: the new definition has no state for 1 entity in `deleting` \
//!      (declare `renamed_from` on a state or a `[migrate]` entry)"
//! );
//! ```

use std::fmt;

use crate::machine::Machine;
use crate::names::MachineName;

mod plan;
pub use plan::{Move, Occupied, Plan, home, plan, rests};

/// How a new version takes the live entities of the versions before it (`upgrade`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Every entity moves at once, through the declared state mapping (the default).
    #[default]
    Migrate,
    /// An entity keeps the version it runs under until it is at rest (a stable, terminal
    /// or deleted state), then moves; entities at rest when the version is deployed move
    /// at once.
    Pin,
}

impl Policy {
    /// `pin` or `migrate`.
    pub fn parse(text: &str) -> Option<Policy> {
        match text {
            "pin" => Some(Policy::Pin),
            "migrate" => Some(Policy::Migrate),
            _ => None,
        }
    }
    /// The key's value: `pin` or `migrate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Pin => "pin",
            Policy::Migrate => "migrate",
        }
    }
}

/// A new definition refused because stored entities would be left in states it does not
/// declare and does not map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeRefused {
    /// The machine.
    pub machine: MachineName,
    /// The states with no home in the new definition, with the number of stored entities
    /// in each, in the order they were given to [`check`].
    pub unmapped: Vec<(String, u64)>,
    /// Pinned entities still working (`pin`) that could come to rest in a state with no
    /// home in the new definition: the state they are in, that resting state, and how
    /// many ([`plan`]).
    pub would_rest: Vec<(String, String, u64)>,
}

/// One line, e.g. (wrapped here):
///
/// ```text
/// machine `server`: the new definition has no state for 12 entities in `provisioning`,
/// 3 in `configuring` (declare `renamed_from` on a state or a `[migrate]` entry)
/// ```
impl fmt::Display for UpgradeRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "machine `{}`: the new definition has no state for ", self.machine)?;
        for (i, (state, count)) in self.unmapped.iter().enumerate() {
            match (i, count) {
                (0, 1) => write!(f, "1 entity in `{state}`")?,
                (0, _) => write!(f, "{count} entities in `{state}`")?,
                _ => write!(f, ", {count} in `{state}`")?,
            }
        }
        for (i, (state, rest, count)) in self.would_rest.iter().enumerate() {
            if i > 0 || !self.unmapped.is_empty() {
                f.write_str(", ")?;
            }
            let entities = if *count == 1 { "entity" } else { "entities" };
            write!(f, "`{rest}`, where {count} pinned {entities} working in `{state}` may come to rest")?;
        }
        f.write_str(" (declare `renamed_from` on a state or a `[migrate]` entry)")
    }
}

impl std::error::Error for UpgradeRefused {}

/// Checks whether `new` can replace the stored definition of its machine, whose stored
/// entities occupy the states `occupied` (state name, number of entities).
///
/// A state `new` declares as a leaf needs nothing. A state it no longer declares must be
/// mapped by [`Machine::state_mapping`] (always to a declared state): its entities move
/// there (to its initial leaf, if it is a parent); a state that has become a parent moves
/// its entities to its initial leaf. Each move comes back as `(old, new, count)`, in the
/// order of `occupied`. States with a
/// count of zero are ignored; a state listed more than once counts the sum.
///
/// Errors: [`UpgradeRefused`] with every occupied state that is neither declared nor
/// mapped, and its count; nothing should be moved then.
pub fn check(new: &Machine, occupied: &[(String, u64)]) -> Result<Vec<(String, String, u64)>, UpgradeRefused> {
    // Sum duplicates, keeping the order of first appearance.
    let mut counts: Vec<(&str, u64)> = Vec::new();
    for (state, count) in occupied {
        match counts.iter_mut().find(|(s, _)| s == state) {
            Some((_, sum)) => *sum = sum.saturating_add(*count),
            None => counts.push((state, *count)),
        }
    }
    let mapping = new.state_mapping();
    let mut moves = Vec::new();
    let mut unmapped = Vec::new();
    for (state, count) in counts {
        if count == 0 {
            continue;
        }
        let target = match new.state(state) {
            Some(s) if !s.is_parent() => continue,
            Some(s) => &s.name,
            None => match mapping.get(state) {
                Some(target) => target,
                None => {
                    unmapped.push((state.to_string(), count));
                    continue;
                }
            },
        };
        moves.push((state.to_string(), new.descend(target).name.to_string(), count));
    }
    if unmapped.is_empty() {
        Ok(moves)
    } else {
        Err(UpgradeRefused { machine: new.name().clone(), unmapped, would_rest: Vec::new() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::MachineBuilder;
    use crate::names::StateName;

    /// `server` after renaming `provisioning` to `setting_up` and dropping `configuring`
    /// and `deleting` (the latter's entities go to `gone`).
    fn upgraded() -> Machine {
        MachineBuilder::new("server")
            .state("new")
            .initial()
            .state("setting_up")
            .renamed_from(["provisioning", "installing"])
            .auto("set_up")
            .state("ready")
            .state("gone")
            .kind(crate::StateKind::Deleted)
            .event("create", ["new"], "begin")
            .event("delete", ["ready"], "drop")
            .action("begin", ["setting_up"])
            .action("set_up", ["ready", "setting_up"])
            .action("drop", ["gone"])
            .migrate("deleting", "gone")
            .build()
            .unwrap()
    }

    fn occupied(list: &[(&str, u64)]) -> Vec<(String, u64)> {
        list.iter().map(|(s, n)| (s.to_string(), *n)).collect()
    }

    #[test]
    fn state_mapping_combines_renamed_from_and_migrate() {
        let mapping: Vec<(StateName, StateName)> = upgraded().state_mapping().into_iter().collect();
        let expected: Vec<(StateName, StateName)> =
            [("deleting", "gone"), ("installing", "setting_up"), ("provisioning", "setting_up")]
                .into_iter()
                .map(|(a, b)| (a.into(), b.into()))
                .collect();
        assert_eq!(mapping, expected);
        assert_eq!(upgraded().state("setting_up").unwrap().renamed_from, ["provisioning", "installing"]);
    }

    #[test]
    fn declared_states_stay_and_mapped_ones_move() {
        let m = upgraded();
        let moves = check(&m, &occupied(&[("ready", 40), ("provisioning", 12), ("new", 2), ("deleting", 1)])).unwrap();
        assert_eq!(
            moves,
            [("provisioning".to_string(), "setting_up".to_string(), 12), ("deleting".into(), "gone".into(), 1)]
        );
        assert_eq!(check(&m, &[]), Ok(vec![]));
        assert_eq!(check(&m, &occupied(&[("ready", 3)])), Ok(vec![]));
    }

    #[test]
    fn unmapped_states_refuse_the_upgrade_with_every_count() {
        let m = upgraded();
        let err = check(&m, &occupied(&[("provisioning", 12), ("ready", 1), ("configuring", 3), ("resizing", 1)]))
            .unwrap_err();
        assert_eq!(
            err,
            UpgradeRefused {
                machine: "server".into(),
                unmapped: occupied(&[("configuring", 3), ("resizing", 1)]),
                would_rest: vec![]
            }
        );
        assert_eq!(
            err.to_string(),
            "machine `server`: the new definition has no state for 3 entities in `configuring`, 1 in `resizing` \
             (declare `renamed_from` on a state or a `[migrate]` entry)"
        );
    }

    #[test]
    fn the_message_reads_like_the_brief() {
        let err = UpgradeRefused {
            machine: "server".into(),
            unmapped: occupied(&[("provisioning", 12), ("configuring", 3)]),
            would_rest: vec![],
        };
        assert_eq!(
            err.to_string(),
            "machine `server`: the new definition has no state for 12 entities in `provisioning`, 3 in `configuring` \
             (declare `renamed_from` on a state or a `[migrate]` entry)"
        );
        let err =
            UpgradeRefused { machine: "server".into(), unmapped: occupied(&[("provisioning", 1)]), would_rest: vec![] };
        assert_eq!(
            err.to_string(),
            "machine `server`: the new definition has no state for 1 entity in `provisioning` \
             (declare `renamed_from` on a state or a `[migrate]` entry)"
        );
    }

    #[test]
    fn empty_states_are_ignored_and_repeated_states_summed() {
        let m = upgraded();
        assert_eq!(check(&m, &occupied(&[("configuring", 0), ("ready", 0)])), Ok(vec![]));
        assert_eq!(
            check(&m, &occupied(&[("provisioning", 2), ("new", 1), ("provisioning", 3)])),
            Ok(vec![("provisioning".to_string(), "setting_up".to_string(), 5)])
        );
        let err = check(&m, &occupied(&[("configuring", 2), ("configuring", 0), ("configuring", 1)])).unwrap_err();
        assert_eq!(err.unmapped, occupied(&[("configuring", 3)]));
    }

    /// Substates map like states: a state that became a parent sends its entities to its
    /// initial leaf, and so does a mapping to a parent.
    #[test]
    fn entities_land_in_leaves_when_states_become_parents() {
        let new = MachineBuilder::new("vm")
            .state("new")
            .initial()
            .state("active")
            .initial_child("running")
            .state("running")
            .parent("active")
            .state("paused")
            .parent("active")
            .renamed_from(["suspended"])
            .state("off")
            .event("start", ["new"], "boot")
            .event("stop", ["active"], "halt")
            .event("pause", ["running"], "hold")
            .action("boot", ["active"])
            .action("halt", ["off"])
            .action("hold", ["paused"])
            .migrate("up", "active")
            .build()
            .unwrap();
        let occupied = [
            ("new".to_string(), 1),
            ("active".to_string(), 5),
            ("suspended".to_string(), 2),
            ("up".to_string(), 3),
            ("running".to_string(), 4),
        ];
        assert_eq!(
            check(&new, &occupied).unwrap(),
            [
                ("active".to_string(), "running".to_string(), 5),
                ("suspended".to_string(), "paused".to_string(), 2),
                ("up".to_string(), "running".to_string(), 3),
            ]
        );
    }
}
