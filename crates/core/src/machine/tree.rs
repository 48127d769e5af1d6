//! The state tree (DESIGN §1, "Composite states"): substates, and every query about states
//! that must understand nesting.
//!
//! An entity is always in a *leaf* state, and *in* each of its ancestors too: an event,
//! a rejection reason, a timer or a subscription declared on an ancestor applies to every
//! descendant, unless a state nearer the leaf decides otherwise (the innermost wins). A
//! parent is never occupied by itself: entering it enters its initial child, recursively
//! ([`Machine::descend`]). A transition leaves and enters exactly the states between the
//! leaf and the target below their lowest common ancestor ([`Machine::transition_path`]).
//!
//! On a flat machine every state is its own whole path, and these queries cost what they
//! did before substates existed.

use super::def::Health;
use super::model::{Event, Machine, State, Timer};
use crate::names::StateName;

/// The states an entity in one state is in: that state, then each ancestor up to the
/// root (innermost first). See [`Machine::path`].
#[derive(Clone)]
pub struct Path<'m> {
    machine: &'m Machine,
    next: Option<usize>,
}

impl<'m> Iterator for Path<'m> {
    type Item = &'m State;
    fn next(&mut self) -> Option<&'m State> {
        let i = self.next?;
        self.next = self.machine.parents[i];
        Some(&self.machine.states()[i])
    }
}

/// Where an event is decided for an entity in some state: the innermost state of its path
/// that the event lists (`in`) or ignores (`ignore`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Level<'m> {
    /// The event is valid, as declared for this state.
    Valid(&'m State),
    /// The event is accepted and dropped, as declared for this state.
    Ignored(&'m State),
}

/// The states a transition leaves and enters (see [`Machine::transition_path`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Transition<'m> {
    /// The states left, innermost first.
    pub left: Vec<&'m State>,
    /// The states entered, outermost first; the last is the new leaf.
    pub entered: Vec<&'m State>,
    /// The leaf the entity is in afterwards.
    pub leaf: &'m State,
    /// The entity's [`HISTORY_PROPERTY`] afterwards, when the transition changes it (it
    /// leaves a parent with `history`).
    pub history: Option<Memory>,
}

/// The property that keeps where an entity last was in each parent with `history`: an
/// object, parent name → the substate to resume (its child for shallow history, the leaf
/// for deep). Written by the engine with the transition that leaves the parent; a
/// property name starting with `$` is the engine's, never an action's.
pub const HISTORY_PROPERTY: &str = "$history";

/// A [`HISTORY_PROPERTY`] value.
pub type Memory = serde_json::Map<String, serde_json::Value>;

/// Whether a property is the engine's (its name starts with `$`, as [`HISTORY_PROPERTY`]):
/// no definition, report or handler writes one.
pub fn is_engine_property(name: &str) -> bool {
    name.starts_with('$')
}

impl Machine {
    /// The state named `state` and its ancestors, innermost first (empty for a state the
    /// machine does not declare).
    pub fn path(&self, state: &str) -> Path<'_> {
        Path { machine: self, next: self.state_index.get(state).copied() }
    }

    /// Whether the machine has substates at all.
    pub fn is_nested(&self) -> bool {
        self.nested
    }

    /// Whether an entity in `state` is in `ancestor`: it is `state` or one of its
    /// ancestors.
    pub fn is_in(&self, state: &str, ancestor: &str) -> bool {
        self.path(state).any(|s| s.name == ancestor)
    }

    /// The direct substates of `state`, in declaration order.
    pub fn children<'m>(&'m self, state: &'m str) -> impl Iterator<Item = &'m State> + 'm {
        self.states().iter().filter(move |s| s.parent.as_deref() == Some(state))
    }

    /// `state` and every state below it: what "in `state`" matches (lists, filters,
    /// patterns). A leaf is only itself.
    pub fn within(&self, state: &str) -> Vec<&StateName> {
        self.states().iter().filter(|s| self.is_in(&s.name, state)).map(|s| &s.name).collect()
    }

    /// The substates of `state` in each of `machines` that nests it, as (machine, state)
    /// pairs: what "in `state`" adds to an exact match when listing entities of several
    /// machines. Empty when no machine declares `state` as a parent.
    pub fn substates_across<'m>(machines: impl IntoIterator<Item = &'m Machine>, state: &str) -> Vec<(String, String)> {
        machines
            .into_iter()
            .flat_map(|m| {
                m.within(state)
                    .into_iter()
                    .filter(move |s| s.as_str() != state)
                    .map(move |s| (m.name().to_string(), s.to_string()))
            })
            .collect()
    }

    /// The leaf entered when `state` is: `state` itself, or the leaf its initial children
    /// lead to.
    ///
    /// # Panics
    /// On a state the machine does not declare.
    pub fn descend(&self, state: &str) -> &State {
        self.descend_resuming(state, None)
    }

    /// The leaf entered when `state` is, resuming by history: a parent with `history` whose
    /// remembered substate (in `memory`, the entity's [`HISTORY_PROPERTY`]: parent name →
    /// substate) is still one of its substates resumes there; any other parent enters its
    /// initial child. Recursively, so a resumed child with history of its own resumes too.
    ///
    /// # Panics
    /// On a state the machine does not declare.
    pub fn descend_resuming(&self, state: &str, memory: Option<&Memory>) -> &State {
        let mut s = self.state(state).expect("a declared state");
        loop {
            let resumed = s
                .history
                .and(memory)
                .and_then(|m| m.get(s.name.as_str()))
                .and_then(serde_json::Value::as_str)
                .filter(|r| *r != s.name.as_str() && self.is_in(r, &s.name))
                .and_then(|r| self.state(r));
            match resumed.or_else(|| s.initial_child.as_ref().and_then(|c| self.state(c))) {
                Some(next) => s = next,
                None => return s,
            }
        }
    }

    /// The innermost state of `state`'s path where `event` is listed or ignored, if any.
    pub fn event_level<'m>(&'m self, event: &Event, state: &str) -> Option<Level<'m>> {
        self.path(state).find_map(|s| {
            if event.valid_in(&s.name) {
                Some(Level::Valid(s))
            } else if event.ignored_in(&s.name) {
                Some(Level::Ignored(s))
            } else {
                None
            }
        })
    }

    /// Whether `event` is valid for an entity in `state` (at its innermost level).
    pub fn event_applies(&self, event: &Event, state: &str) -> bool {
        matches!(self.event_level(event, state), Some(Level::Valid(_)))
    }

    /// Events valid for an entity in `state`, in declaration order (guards aside).
    pub fn permitted_events(&self, state: &str) -> impl Iterator<Item = &Event> {
        let state = state.to_string();
        self.events().iter().filter(move |e| self.event_applies(e, &state))
    }

    /// Subscription events valid for an entity in `state`, in declaration order: those the
    /// runtime evaluates while an entity is in `state`.
    pub fn subscriptions_in(&self, state: &str) -> impl Iterator<Item = &Event> {
        self.permitted_events(state).filter(|e| e.subscribe.is_some())
    }

    /// Timers that run for an entity in `state` (declared for it or an ancestor), in
    /// declaration order.
    pub fn timers_in(&self, state: &str) -> impl Iterator<Item = &Timer> {
        let state = state.to_string();
        self.timers().iter().filter(move |t| self.path(&state).any(|s| t.valid_in(&s.name)))
    }

    /// The health of an entity in `state`: [`Health::Error`] if the state or an ancestor
    /// declares it; [`Health::Ok`] for a state the machine does not declare.
    pub fn health_of(&self, state: &str) -> Health {
        if self.path(state).any(|s| s.health == Health::Error) { Health::Error } else { Health::Ok }
    }

    /// The rejection reason declared for `event` in `state` or, failing that, its nearest
    /// ancestor that declares one.
    pub fn rejection_reason<'m>(&'m self, event: &'m Event, state: &str) -> Option<&'m str> {
        self.path(state).find_map(|s| event.reject.get(&s.name).map(String::as_str))
    }

    /// The states a transition from the leaf `from` to the declared target `to` leaves
    /// and enters: below their lowest common ancestor, which is neither left nor entered.
    /// The leaf entered is `to`'s [`descend`](Machine::descend). A transition back to the
    /// same leaf leaves and enters nothing.
    ///
    /// # Panics
    /// On a state the machine does not declare.
    pub fn transition_path(&self, from: &str, to: &str) -> Transition<'_> {
        self.transition_resuming(from, to, false, None)
    }

    /// A re-entry of `target`, a state the leaf `from` is in (the leaf itself or one of
    /// its ancestors): the states from the leaf up to `target` are left, innermost first,
    /// `target` included, then `target` and the states down to the leaf it leads to
    /// ([`descend`](Machine::descend)) are entered, outermost first. Stateless's
    /// `PermitReentry`, and SCXML's external transition to a state the entity is in.
    ///
    /// # Panics
    /// On a state the machine does not declare.
    pub fn reentry_path(&self, from: &str, target: &str) -> Transition<'_> {
        self.transition_resuming(from, target, true, None)
    }

    /// [`transition_path`](Machine::transition_path), or [`reentry_path`](Machine::reentry_path)
    /// when `reentry`, with the parents' history: each parent with `history` the transition
    /// leaves remembers where the entity was in it (its child on the way for shallow
    /// history, the leaf for deep), and the leaf entered is resumed by the memory so updated
    /// ([`descend_resuming`](Machine::descend_resuming)). `memory` is the entity's
    /// [`HISTORY_PROPERTY`]; the transition's [`Transition::history`] is its new value when
    /// the transition changes it.
    ///
    /// # Panics
    /// On a state the machine does not declare.
    pub fn transition_resuming(&self, from: &str, to: &str, reentry: bool, memory: Option<&Memory>) -> Transition<'_> {
        let from_path: Vec<&State> = self.path(from).collect();
        // The states left: up to and including `to` on a re-entry, else those below the
        // lowest common ancestor (none when `to` is the leaf itself: staying).
        let left_count = if reentry {
            from_path.iter().position(|s| s.name == to).map_or(0, |i| i + 1)
        } else {
            let to_path: Vec<&State> = self.path(to).collect();
            from_path.iter().position(|s| to_path.iter().any(|t| t.name == s.name)).unwrap_or(from_path.len())
        };
        let left = from_path[..left_count].to_vec();
        let mut history = None;
        for (i, p) in left.iter().enumerate().filter(|(_, p)| p.history.is_some()) {
            let was = match p.history {
                Some(super::def::History::Shallow) if i > 0 => &from_path[i - 1].name,
                _ => &from_path[0].name,
            };
            let m: &mut Memory = history.get_or_insert_with(|| memory.cloned().unwrap_or_default());
            m.insert(p.name.to_string(), serde_json::Value::from(was.as_str()));
        }
        let leaf = self.descend_resuming(to, history.as_ref().or(memory));
        // Entered: from the leaf up to the first state not left (exclusive: the common
        // ancestor, or `to`'s parent on a re-entry; the leaf itself when staying), outermost
        // first.
        let stop = from_path.get(left_count).map(|s| &s.name);
        let mut entered: Vec<&State> = self.path(&leaf.name).take_while(|s| Some(&s.name) != stop).collect();
        entered.reverse();
        Transition { left, entered, leaf, history }
    }
}
