//! Definitions deployed to a running deployment (DESIGN §9, "Versions").
//!
//! A deploy ([`Engine::deploy`]) checks each new version against the live entities of its
//! machine first (`settle_core::upgrade::plan`: every state they are in, or, pinned, may
//! come to rest in, must have a home), refuses one that would strand any (naming them),
//! then stores it as the machine's current version, moves the entities the plan moves
//! now, and replaces the engine's registry. New entities start under the new version; an
//! entity keeps the version it runs under until it moves: at once (`upgrade = "migrate"`,
//! the default), or once at rest (`pin`), with its own commit (`decide::upgrade`). Several
//! versions thus run side by side, each entity decided by its own.
//!
//! Every instance takes a deploy up without a restart: a deploy writes a marker
//! ([`MARKER`]) after its versions, which each engine reads every `poll` ([`watch`]) and,
//! when it changed, reads the stored versions again ([`Engine::reload`]).

use std::sync::{Arc, Weak};
use std::time::Duration;

use settle_core::upgrade::{Occupied, Plan};
use settle_core::{Machine, MachineName};
use settle_store::{EntityFilter, MachineRecord, Millis, Moves, NewVersion, StateMove, Store};

use crate::engine::{Engine, Inner};
use crate::error::{Error, Result, Stranded};
use crate::registry::Registry;

/// The store's meta key a deploy writes last: `{deployed_at}:{machine}:{hash}` of the
/// newest version deployed.
pub(crate) const MARKER: &str = "definitions.deployed";

/// How many entities a refusal names per state.
const NAMED: u64 = 10;

/// What a deploy did (or, on a dry run, would do) to one machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployed {
    /// The machine.
    pub machine: String,
    /// The version deployed (its content hash).
    pub version: String,
    /// The version it replaces as current, if any.
    pub previous: Option<String>,
    /// How live entities move to it: `pin` or `migrate`.
    pub upgrade: &'static str,
    /// Entities moved to it now.
    pub moved: u64,
    /// Entities working under an older version that keep it until they rest (`pin`).
    pub pinned: u64,
    /// The version was already the current one: nothing changed.
    pub unchanged: bool,
}

impl<S: Store + Clone> Engine<S> {
    /// Deploys `machines` (validated definitions) to the running deployment: each one
    /// whose content differs from its machine's current version is checked against the
    /// live entities, then stored as the current version; the entities the machine's
    /// `upgrade` policy moves now move; this engine runs it at once, every other instance
    /// within its `poll`. With `dry_run`, checks and answers what would happen, changing
    /// nothing.
    ///
    /// All or nothing for the checks: a version that would strand live entities refuses
    /// the whole deploy ([`Error::UpgradeRefused`], naming them) before anything is
    /// stored; so do an invalid set of machines (a version referring to a machine or
    /// event the others do not declare) and an action this engine has no handler for.
    pub async fn deploy(&self, machines: Vec<Machine>, dry_run: bool) -> Result<Vec<Deployed>> {
        let mut names: Vec<&str> = machines.iter().map(|m| m.name().as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            let what = "two definitions of it in one deploy".to_string();
            return Err(Error::Unsupported { machine: w[0].to_string(), what });
        }
        if !dry_run {
            self.inner.writable("deploy")?;
        }
        let _one = self.inner.deploying.lock().await;
        self.reload().await?;
        let registry = self.inner.registry();
        let mut next = (*registry).clone();
        let mut changed: Vec<(Arc<Machine>, String)> = Vec::new();
        let mut out: Vec<Deployed> = Vec::new();
        for m in machines {
            let hash = m.content_hash();
            if next.hashes.get(m.name()) == Some(&hash) {
                out.push(Deployed {
                    machine: m.name().to_string(),
                    previous: Some(hash.clone()),
                    version: hash,
                    upgrade: m.upgrade().as_str(),
                    moved: 0,
                    pinned: 0,
                    unchanged: true,
                });
                continue;
            }
            let m = Arc::new(m);
            next.set_current(m.clone(), hash.clone());
            changed.push((m, hash));
        }
        let all: Vec<&Machine> = next.machines.values().map(|m| m.as_ref()).collect();
        let report = settle_core::validate::check_set(&all);
        if report.has_errors() {
            return Err(Error::Invalid(report));
        }
        // An engine that processes nothing (`settle deploy` on the database) runs no
        // action: a deploy stores and moves, whatever handlers the versions need.
        if self.inner.processes {
            check_handlers(&next)?;
        }
        let mut plans = Vec::new();
        for (m, hash) in &changed {
            plans.push(plan(&self.inner.store, &registry, m, hash).await?);
        }
        let now = self.inner.clock.now_ms();
        let mut moved = vec![0; changed.len()];
        if !dry_run && !changed.is_empty() {
            // The new versions are known from now on (an entity the deploy moves runs under
            // its version wherever it is claimed), but not yet current; once every commit
            // decided before is written, the plans are made again on what the entities are
            // now, and the versions, the moves and the marker are written in one
            // transaction: all of them or, if any plan is refused now, none.
            let mut known = (*registry).clone();
            for (m, hash) in &changed {
                known.versions.insert(hash.clone(), m.clone());
            }
            self.inner.registries.replace(known);
            self.barrier().await?;
            let mut deploy = settle_store::Deploy { now, ..Default::default() };
            for (i, (m, hash)) in changed.iter().enumerate() {
                plans[i] = plan(&self.inner.store, &registry, m, hash).await?;
                deploy.versions.push(new_version(m, hash, ""));
                deploy.moves.push(moves_of(m.name(), hash, &plans[i]));
            }
            let marker = changed.last().map(|(m, h)| marker(now, m.name(), h));
            deploy.meta = marker.clone();
            moved = self.inner.store.machine_deploy(deploy).await?;
            self.inner.registries.replace(next);
            *self.inner.deployed.lock().unwrap_or_else(|e| e.into_inner()) = marker.map(|(_, v)| v);
            self.after_replace().await?;
            // Entities this engine brought to rest under an older version while the new one
            // was not yet current move now that their commits are written.
            self.barrier().await?;
            for (name, n) in self.settle_held().await? {
                if let Some(i) = changed.iter().position(|(m, _)| *m.name() == name) {
                    moved[i] += n;
                }
            }
        }
        for (i, ((m, hash), plan)) in changed.iter().zip(&plans).enumerate() {
            let moved = if dry_run { plan.moves.iter().map(|mv| mv.count).sum() } else { moved[i] };
            out.push(Deployed {
                machine: m.name().to_string(),
                version: hash.clone(),
                previous: registry.hashes.get(m.name()).cloned(),
                upgrade: m.upgrade().as_str(),
                moved,
                pinned: plan.pinned.iter().map(|p| p.2).sum(),
                unchanged: false,
            });
        }
        if !dry_run && !changed.is_empty() {
            // Once every instance took it up, the entities that came to rest under an
            // older version on one that had not yet move too.
            let (inner, wait) = (Arc::downgrade(&self.inner), self.inner.poll * 2);
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                if let Some(inner) = inner.upgrade()
                    && let Err(e) = (Engine { inner }).settle_versions().await
                {
                    tracing::warn!(error = %e, "moving entities to the deployed versions failed");
                }
            });
            for d in &out {
                tracing::info!(machine = %d.machine, version = %d.version, moved = d.moved, pinned = d.pinned, "version deployed");
            }
        }
        out.sort_by(|a, b| a.machine.cmp(&b.machine));
        Ok(out)
    }

    /// Takes up the versions other instances deployed since this engine last looked: the
    /// newest stored version of each machine it knows becomes its current one, and the
    /// older ones stay known for the entities still under them. Runs on its own every
    /// `poll`; call it to take them up now.
    pub async fn reload(&self) -> Result<()> {
        let store = &self.inner.store;
        let marker = store.meta_get(MARKER).await?;
        if marker == *self.inner.deployed.lock().unwrap_or_else(|e| e.into_inner()) {
            return Ok(());
        }
        let mut next = (*self.inner.registry()).clone();
        let changed = take_up(&store.machine_list().await?, &mut next);
        *self.inner.deployed.lock().unwrap_or_else(|e| e.into_inner()) = marker;
        if changed {
            self.inner.registries.replace(next);
            self.after_replace().await?;
        }
        Ok(())
    }

    /// Moves to its machine's current version every entity the version's `upgrade` policy
    /// lets move now and that is still under an older one (reads every entity of the
    /// machines that have older versions). A deploy does this at once and again two `poll`s
    /// later (entities another instance brought to rest under an older version before it
    /// took the deploy up). Returns how many moved.
    pub async fn settle_versions(&self) -> Result<u64> {
        let _one = self.inner.deploying.lock().await;
        Ok(self.settle_held().await?.iter().map(|(_, n)| n).sum())
    }

    /// [`settle_versions`](Self::settle_versions), with the deploy lock held: how many moved,
    /// by machine.
    async fn settle_held(&self) -> Result<Vec<(MachineName, u64)>> {
        if self.inner.read_only {
            return Ok(Vec::new());
        }
        let registry = self.inner.registry();
        let mut names: Vec<&MachineName> = registry.machines.keys().collect();
        names.sort();
        let mut deploy = settle_store::Deploy { now: self.inner.clock.now_ms(), ..Default::default() };
        let mut machines = Vec::new();
        for name in names {
            let (m, hash) = (&registry.machines[name], &registry.hashes[name]);
            if !registry.versions.iter().any(|(h, v)| v.name() == name && h != hash) {
                continue;
            }
            let Ok(plan) = plan(&self.inner.store, &registry, m, hash).await else { continue };
            let moves = moves_of(name, hash, &plan);
            if !moves.moves.is_empty() {
                deploy.moves.push(moves);
                machines.push(name.clone());
            }
        }
        if deploy.moves.is_empty() {
            return Ok(Vec::new());
        }
        let moved = self.inner.store.machine_deploy(deploy).await?;
        let total: u64 = moved.iter().sum();
        if total > 0 {
            tracing::info!(entities = total, "moved entities to the deployed versions");
        }
        Ok(machines.into_iter().zip(moved).collect())
    }

    /// Waits until every commit the scheduler queued before now is written.
    async fn barrier(&self) -> Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(crate::msg::Msg::Barrier(tx))?;
        rx.await.map_err(|_| Error::Stopped)
    }

    /// What follows a new registry: the schedules it declares are stored.
    async fn after_replace(&self) -> Result<()> {
        if self.inner.read_only {
            return Ok(());
        }
        crate::schedules::sync(self).await?;
        self.inner.schedules.notify_one();
        Ok(())
    }
}

/// Every action of a served machine that needs a handler has one.
pub(crate) fn check_handlers(registry: &Registry) -> Result<()> {
    let mut missing = Vec::new();
    for m in registry.machines.values().filter(|m| registry.serves(m.name())) {
        for a in m.actions_needing_handlers() {
            if registry.handler(m.name(), &a.name).is_none() {
                missing.push(format!("action `{}` of machine `{}`", a.name, m.name()));
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    missing.sort();
    Err(Error::MissingHandlers(missing))
}

/// Takes up the `stored` versions of the machines `registry` knows: the newest of each
/// becomes current (another instance deployed it), every other one is known by its hash.
/// Answers whether anything changed.
pub(crate) fn take_up(stored: &[MachineRecord], registry: &mut Registry) -> bool {
    let mut changed = false;
    let names: Vec<MachineName> = registry.machines.keys().cloned().collect();
    for name in names {
        let mut versions: Vec<_> = stored.iter().filter(|r| r.name == name).collect();
        versions.sort_by_key(|r| r.created_at);
        for r in &versions {
            if registry.versions.contains_key(&r.hash) {
                continue;
            }
            match Machine::from_canonical_json(&r.definition) {
                Ok(m) => {
                    registry.versions.insert(r.hash.clone(), Arc::new(m));
                }
                Err(e) => {
                    tracing::warn!(machine = %name, version = %r.hash, error = %e, "a stored version does not read back; its entities run under the current one");
                }
            }
        }
        let Some(newest) = versions.last() else { continue };
        if registry.hashes.get(&name) != Some(&newest.hash)
            && let Some(m) = registry.versions.get(&newest.hash).cloned()
        {
            tracing::info!(machine = %name, version = %newest.hash, "took up a deployed version");
            registry.set_current(m, newest.hash.clone());
            changed = true;
        }
    }
    changed
}

/// Plans the deploy of `new` (hash `hash`) over its machine's live entities, each under
/// the version it runs under (`registry`'s; an unknown or unrecorded one counts as the
/// current). Refused with the first keys of every stranded state.
pub(crate) async fn plan<S: Store>(store: &S, registry: &Registry, new: &Machine, hash: &str) -> Result<Plan> {
    let counts = store.entity_count_by_version(new.name()).await?;
    let current = registry.machines.get(new.name());
    let occupied: Vec<Occupied<'_>> = counts
        .iter()
        .map(|(h, state, count)| Occupied {
            hash: h,
            version: registry.versions.get(h).filter(|m| m.name() == new.name()).or(current).map(|m| m.as_ref()),
            state,
            count: *count,
        })
        .collect();
    let refused = match settle_core::upgrade::plan(new, hash, &occupied) {
        Ok(plan) => return Ok(plan),
        Err(refused) => refused,
    };
    let mut stranded = Vec::new();
    let all = refused.unmapped.iter().map(|(s, n)| (s, None, *n));
    for (state, rest, count) in all.chain(refused.would_rest.iter().map(|(s, r, n)| (s, Some(r), *n))) {
        let filter = EntityFilter {
            machine: Some(new.name().to_string()),
            state: Some(state.clone()),
            limit: Some(NAMED),
            ..EntityFilter::default()
        };
        let keys = store.entity_list(filter).await?.into_iter().map(|e| e.key.to_string()).collect();
        stranded.push(Stranded {
            machine: new.name().to_string(),
            state: state.clone(),
            rest: rest.cloned(),
            count,
            keys,
        });
    }
    let mut message = refused.to_string();
    for s in &stranded {
        let more = s.count.saturating_sub(s.keys.len() as u64);
        let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
        message.push_str(&format!("; in `{}`: {}{tail}", s.state, s.keys.join(", ")));
    }
    Err(Error::UpgradeRefused { message, stranded })
}

/// `machine` (of content hash `hash`) as a version to store, deployed by `origin`.
pub(crate) fn new_version(machine: &Machine, hash: &str, origin: &str) -> NewVersion {
    NewVersion {
        name: machine.name().to_string(),
        hash: hash.to_string(),
        definition: machine.canonical_json(),
        origin: origin.to_string(),
    }
}

/// The moves `plan` makes now, of the entities of `name` to its version `hash`.
pub(crate) fn moves_of(name: &str, hash: &str, plan: &Plan) -> Moves {
    Moves { machine: name.to_string(), hash: hash.to_string(), moves: state_moves(plan) }
}

/// The deploy marker ([`MARKER`]) of a deploy at `now` whose last version is `hash` of `name`.
pub(crate) fn marker(now: Millis, name: &str, hash: &str) -> (String, String) {
    (MARKER.to_string(), format!("{now}:{name}:{hash}"))
}

/// The store's moves of `plan`'s.
fn state_moves(plan: &Plan) -> Vec<StateMove> {
    plan.moves.iter().map(|m| StateMove { version: m.hash.clone(), from: m.from.clone(), to: m.to.clone() }).collect()
}

/// Takes up deploys made by other instances every `poll`, until the engine goes away.
pub(crate) async fn watch<S: Store + Clone>(inner: Weak<Inner<S>>, poll: Duration) {
    loop {
        tokio::time::sleep(poll).await;
        let Some(strong) = inner.upgrade() else { return };
        if strong.tx.is_closed() {
            return;
        }
        let engine = Engine { inner: strong };
        if let Err(e) = engine.reload().await {
            tracing::warn!(error = %e, "reading deployed versions failed; trying again");
        }
    }
}
