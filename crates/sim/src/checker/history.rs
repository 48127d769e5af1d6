//! The entities as their history tells them ([`Entities`]): each one's state entries in
//! order, checked as the rows come: created once, first row its creation, every row that
//! names the state it started from names the state the previous entry entered (a commit
//! applied twice, or by a writer with a stale snapshot, breaks the chain), and as many
//! history rows that processed an event as processed events (an event processed twice shows
//! as one more row).

use std::collections::{HashMap, HashSet};

use settle_core::retention::Keep;

use super::HistoryRow;

/// A failed check: what, and the entities involved.
pub(crate) type Failure = (String, Vec<String>);

/// One entry into a state: the history row that entered it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// The entering row's id.
    pub(crate) row: i64,
    pub(crate) state: String,
    /// When the entry was committed.
    pub(crate) at: i64,
    /// No earlier than this was it decided (the previous entry's commit, or the create
    /// request's time): timers planned on entry are due no earlier than this plus their
    /// delay. `None`: unknown (an entity another entity's action created).
    pub(crate) decided_after: Option<i64>,
}

/// One entity's history so far.
#[derive(Debug, Clone)]
pub(crate) struct Entity {
    pub(crate) name: String,
    pub(crate) machine: String,
    pub(crate) entries: Vec<Entry>,
}

impl Entity {
    /// The state it is in.
    pub(crate) fn state(&self) -> &str {
        self.entries.last().map_or("", |e| e.state.as_str())
    }
}

/// Every entity the history has named.
#[derive(Debug, Default)]
pub(crate) struct Entities {
    by_id: HashMap<i64, Entity>,
    /// When the world asked for each entity it created (`machine/key`).
    requested: HashMap<String, i64>,
    /// History rows that processed an event, by entity.
    processed: HashMap<i64, i64>,
    /// Entities pruning removed (`machine/key`).
    pruned: HashSet<String>,
    /// How many the last observation found removed.
    pub(crate) pruned_now: usize,
    /// Their names.
    last_pruned: Vec<String>,
}

impl Entities {
    pub(crate) fn get(&self, id: i64) -> Option<&Entity> {
        self.by_id.get(&id)
    }

    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The entity `id` as `machine/key`.
    pub(crate) fn name(&self, id: i64) -> String {
        self.by_id.get(&id).map_or_else(|| format!("entity#{id}"), |e| e.name.clone())
    }

    /// The world asked for `name` at `at`.
    pub(crate) fn requested(&mut self, name: String, at: i64) {
        self.requested.entry(name).or_insert(at);
    }

    /// Takes the next history row.
    pub(crate) fn apply(&mut self, h: &HistoryRow) -> Result<(), Failure> {
        let name = format!("{}/{}", h.machine, h.key);
        if h.kind == "create" {
            if self.by_id.contains_key(&h.entity_id) {
                return Err((format!("{name}: created twice (history row {})", h.id), vec![name]));
            }
            let entry = Entry {
                row: h.id,
                state: h.to.clone().unwrap_or_default(),
                at: h.at,
                decided_after: self.requested.get(&name).copied(),
            };
            self.by_id.insert(h.entity_id, Entity { name, machine: h.machine.clone(), entries: vec![entry] });
            return Ok(());
        }
        let Some(e) = self.by_id.get_mut(&h.entity_id) else {
            return Err((format!("{name}: history row {} ({}) before its creation", h.id, h.kind), vec![name]));
        };
        let current = e.state().to_string();
        if let Some(from) = &h.from
            && *from != current
        {
            return Err((
                format!(
                    "{name}: history chain broken at row {}: a {} from `{from}` while the entity was in `{current}`",
                    h.id, h.kind
                ),
                vec![name],
            ));
        }
        if matches!(h.kind.as_str(), "event" | "rejected" | "internal" | "ignored") && h.event.is_some() {
            *self.processed.entry(h.entity_id).or_default() += 1;
        }
        if let Some(to) = &h.to {
            let decided_after = e.entries.last().map(|p| p.at);
            e.entries.push(Entry { row: h.id, state: to.clone(), at: h.at, decided_after });
        }
        Ok(())
    }

    /// Entities the checker knows that are no longer in the store (`present`) were pruned:
    /// each must have been in an end state of its machine for at least that state's
    /// retention (`kept`) at `now`, and no entity linked to it (`edges`, as last seen:
    /// predecessor, successor) may be live. Pruned, an entity leaves the checks (its events
    /// went with it); a history row of it after that is one before its creation.
    pub(crate) fn pruned(
        &mut self,
        present: &HashSet<i64>,
        now: i64,
        kept: &HashMap<(String, String), Keep>,
        edges: &[(i64, i64)],
    ) -> Result<(), Failure> {
        let mut gone: Vec<i64> = self.by_id.keys().filter(|id| !present.contains(id)).copied().collect();
        gone.sort_unstable();
        self.last_pruned.clear();
        let live = |e: &Entity| !kept.contains_key(&(e.machine.clone(), e.state().to_string()));
        for id in &gone {
            let linked = edges.iter().filter_map(|&(p, s)| (p == *id).then_some(s).or((s == *id).then_some(p)));
            if let Some(other) = linked.filter_map(|o| self.by_id.get(&o)).find(|o| live(o)) {
                let name = self.by_id[id].name.clone();
                return Err((
                    format!(
                        "{name}: gone from the store while {} (linked to it) is live in `{}`",
                        other.name,
                        other.state()
                    ),
                    vec![name, other.name.clone()],
                ));
            }
        }
        for id in &gone {
            let e = &self.by_id[id];
            let (state, at) = e.entries.last().map_or(("", 0), |x| (x.state.as_str(), x.at));
            let name = e.name.clone();
            let since = now - at;
            match kept.get(&(e.machine.clone(), state.to_string())) {
                None => {
                    return Err((
                        format!("{name}: gone from the store while in `{state}`, not an end state"),
                        vec![name],
                    ));
                }
                Some(Keep::Forever) => {
                    return Err((
                        format!("{name}: gone from the store, though `{state}` keeps it forever"),
                        vec![name],
                    ));
                }
                Some(Keep::For(d)) if (since as u128) < d.as_millis() => {
                    return Err((
                        format!("{name}: gone {since} ms after it entered `{state}`, which keeps it {d:?}"),
                        vec![name],
                    ));
                }
                Some(Keep::For(_)) => {}
            }
            self.by_id.remove(id);
            self.processed.remove(id);
            self.pruned.insert(name.clone());
            self.last_pruned.push(name);
        }
        self.pruned_now = gone.len();
        Ok(())
    }

    /// Whether pruning removed `name` (`machine/key`).
    pub(crate) fn was_pruned(&self, name: &str) -> bool {
        self.pruned.contains(name)
    }

    /// The entities the last observation found pruned.
    pub(crate) fn pruned_names(&self) -> impl Iterator<Item = &str> {
        self.last_pruned.iter().map(String::as_str)
    }

    /// How many entities pruning removed.
    pub(crate) fn pruned_total(&self) -> usize {
        self.pruned.len()
    }

    /// Each entity has as many history rows that processed an event as `events` rows not
    /// marked failed (`events`, by entity; an event whose action failed is consumed by a
    /// `fault` row and marked failed).
    pub(crate) fn processed_once(&self, events: &HashMap<i64, i64>) -> Result<(), Failure> {
        let mut ids: Vec<i64> = self.processed.keys().chain(events.keys()).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        for id in &ids {
            let (rows, n) = (self.processed.get(id).copied().unwrap_or(0), events.get(id).copied().unwrap_or(0));
            if rows != n {
                let name = self.name(*id);
                return Err((
                    format!("{name}: {rows} history rows processed an event, but {n} events were processed"),
                    vec![name],
                ));
            }
        }
        Ok(())
    }
}
