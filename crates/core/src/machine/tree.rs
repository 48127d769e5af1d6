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
        let mut s = self.state(state).expect("a declared state");
        while let Some(child) = &s.initial_child {
            s = self.state(child).expect("validated initial child exists");
        }
        s
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
        let leaf = self.descend(to);
        let from_path: Vec<&State> = self.path(from).collect();
        let to_path: Vec<&State> = self.path(&leaf.name).collect();
        // The lowest common ancestor: the first state of `from`'s path also on `to`'s.
        let common = from_path.iter().position(|s| to_path.iter().any(|t| t.name == s.name));
        let left: Vec<&State> = from_path[..common.unwrap_or(from_path.len())].to_vec();
        let lca = common.map(|i| &from_path[i].name);
        let mut entered: Vec<&State> = to_path.iter().take_while(|s| Some(&s.name) != lca).copied().collect();
        entered.reverse();
        Transition { left, entered, leaf }
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
        let leaf = self.descend(target);
        let up_to = |start: &str| -> Vec<&State> {
            let mut states = Vec::new();
            for s in self.path(start) {
                states.push(s);
                if s.name == target {
                    break;
                }
            }
            states
        };
        let left = up_to(from);
        let mut entered = up_to(&leaf.name);
        entered.reverse();
        Transition { left, entered, leaf }
    }
}
