//! Retention carried out: which end states' entities may go and since when (from each
//! machine's definition and the deployment's defaults, [`Config::retention`]), as rounds of
//! [`Op::Prune`] through the engine's one writer — run periodically by the scheduler
//! (`scheduler/prune.rs`) and on demand by [`Engine::prune`] (`settle prune`).

use std::collections::HashMap;

use settle_core::retention::Defaults;
use settle_store::{Millis, Op, Prune, PruneRule, Pruned, PrunedEntity, PrunedRows, Store};
use tokio::sync::oneshot;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::msg::Msg;
use crate::registry::Registry;

/// Where each rule's next round goes on, by (machine, state).
pub(crate) type Cursors = HashMap<(String, String), (Millis, i64)>;

/// The rows of other kinds a round removes at most, per entity of its limit.
const ROWS_PER_ENTITY: usize = 10;

/// One round at `now`: a rule for every end state of the machines known (or of `machine`
/// alone) that is not kept forever, going on from `cursors`; ended operations, finished
/// tasks and minute counts by the deployment's times (not in a round for one machine).
pub(crate) fn round(
    registry: &Registry,
    defaults: &Defaults,
    now: Millis,
    machine: Option<&str>,
    cursors: &Cursors,
    limit: usize,
) -> Prune {
    let mut machines: Vec<_> = registry.machines.values().filter(|m| machine.is_none_or(|n| m.name() == n)).collect();
    machines.sort_by(|a, b| a.name().cmp(b.name()));
    let mut ended = Vec::new();
    for m in machines {
        for (state, keep) in m.end_states_kept(defaults) {
            if let Some(before) = keep.cutoff(now) {
                let key = (m.name().to_string(), state.to_string());
                let after = cursors.get(&key).copied();
                ended.push(PruneRule { machine: key.0, state: key.1, before, after });
            }
        }
    }
    let fleet = machine.is_none();
    Prune {
        ended,
        operations_before: fleet.then(|| defaults.operations.cutoff(now)).flatten(),
        tasks_before: fleet.then(|| defaults.tasks.cutoff(now)).flatten(),
        minutes_before: fleet.then(|| defaults.minutes.cutoff(now)).flatten(),
        limit,
        rows: limit.max(1) * ROWS_PER_ENTITY,
        ..Prune::default()
    }
}

/// The machines of `p`'s rules whose entities are archived before they go (none when the
/// engine has no archive: [`crate::builder`] refuses a machine that asks for one then).
pub(crate) fn archived_by<'a>(
    registry: &'a Registry,
    archive: &'a crate::archive::Shared,
    p: &'a Prune,
) -> impl Iterator<Item = &'a str> + 'a {
    let mut machines: Vec<&str> = p.ended.iter().map(|r| r.machine.as_str()).collect();
    machines.dedup();
    machines
        .into_iter()
        .filter(move |m| archive.is_some() && registry.machines.get(*m).is_some_and(|d| d.archives(true)))
}

/// After a round of `p` that only chose `chosen`: the round that removes exactly those, and
/// those of them the archive takes first (of machines that archive).
pub(crate) fn after_choosing(
    registry: &Registry,
    archive: &crate::archive::Shared,
    p: &Prune,
    chosen: Vec<PrunedEntity>,
) -> (Prune, Vec<PrunedEntity>) {
    let machines: Vec<&str> = archived_by(registry, archive, p).collect();
    let remove = Prune { choose_only: false, only: Some(chosen.iter().map(|e| e.id).collect()), ..p.clone() };
    let archived = chosen.into_iter().filter(|e| machines.contains(&e.machine.as_str())).collect();
    (remove, archived)
}

/// Records where each rule of `p` goes on after a round that answered `next`.
pub(crate) fn advance(cursors: &mut Cursors, p: &Prune, next: &[Option<(Millis, i64)>]) {
    for (rule, next) in p.ended.iter().zip(next) {
        let key = (rule.machine.clone(), rule.state.clone());
        match next {
            Some(at) => cursors.insert(key, *at),
            None => cursors.remove(&key),
        };
    }
}

/// What [`Engine::prune`] did over all its rounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// The entities removed (or, dry, that would be), in the order of the rounds.
    pub entities: Vec<PrunedEntity>,
    /// Entities past their retention kept (linked to a live entity, or with work).
    pub kept: u64,
    /// Rows per table.
    pub rows: PrunedRows,
    /// Rounds written.
    pub rounds: u64,
    /// Entities written to the archive before they went (`Config::archive`).
    pub archived: u64,
}

impl<S: Store + Clone> Engine<S> {
    /// Removes everything past its retention now (of `machine` alone, if given: only its
    /// ended entities), round after round until nothing more is found; with `dry_run`,
    /// counts what would go and changes nothing. `progress` hears each round.
    pub async fn prune(
        &self,
        machine: Option<&str>,
        dry_run: bool,
        mut progress: impl FnMut(&Pruned),
    ) -> Result<PruneReport> {
        if let Some(m) = machine {
            self.inner.registry().machine(m)?;
        }
        let inner = &self.inner;
        let now = inner.clock.now_ms();
        let mut cursors = Cursors::new();
        let mut report = PruneReport::default();
        loop {
            let mut p = round(&inner.registry(), &inner.retention, now, machine, &cursors, inner.prune_limit);
            p.dry_run = dry_run;
            if dry_run && report.rounds > 0 {
                // A dry run removes nothing: the other kinds were counted whole in its
                // first round (below), its later rounds page through entities only.
                (p.operations_before, p.tasks_before, p.minutes_before) = (None, None, None);
            } else if dry_run {
                p.rows = usize::MAX / 2;
            }
            let (pruned, archived) = if dry_run {
                (self.prune_round(p.clone()).await?, 0)
            } else {
                self.archive_then_remove(&p, now).await?
            };
            report.archived += archived as u64;
            if pruned.busy {
                return Err(Error::PruneBusy);
            }
            progress(&pruned);
            report.rounds += 1;
            report.kept += pruned.kept;
            report.rows.add(&pruned.rows);
            advance(&mut cursors, &p, &pruned.next);
            let entities_left = pruned.next.iter().any(Option::is_some);
            let more = pruned.more;
            report.entities.extend(pruned.entities);
            if !(more && (entities_left || !dry_run)) {
                return Ok(report);
            }
        }
    }

    /// A round that archives first where `p`'s machines ask for it: one that only chooses,
    /// the chosen of machines that archive written to the archive and synced, then the
    /// round that removes the chosen. A round without such machines is written at once.
    async fn archive_then_remove(&self, p: &Prune, now: Millis) -> Result<(Pruned, usize)> {
        let inner = &self.inner;
        let archives = archived_by(&inner.registry(), &inner.archive, p).next().is_some();
        let Some(archive) = inner.archive.as_ref().filter(|_| archives) else {
            return Ok((self.prune_round(p.clone()).await?, 0));
        };
        let chosen = self.prune_round(Prune { choose_only: true, ..p.clone() }).await?;
        if chosen.busy {
            return Ok((chosen, 0));
        }
        let (remove, archived) = after_choosing(&inner.registry(), &inner.archive, p, chosen.entities);
        let n = crate::archive::write(&inner.store, archive, &archived, now).await?;
        Ok((self.prune_round(remove).await?, n))
    }

    /// The deployment's retention this engine applies where a definition does not say
    /// ([`crate::Config::retention`]).
    pub fn retention(&self) -> Defaults {
        self.inner.retention
    }

    /// Whether this engine archives what retention removes ([`crate::Config::archive`]).
    pub fn archives(&self) -> bool {
        self.inner.archive.is_some()
    }

    /// Writes one round of pruning through the engine's writer.
    pub async fn prune_round(&self, p: Prune) -> Result<Pruned> {
        let (reply, rx) = oneshot::channel();
        self.send(Msg::Prune { op: Op::Prune(Box::new(p)), reply })?;
        rx.await.map_err(|_| Error::Stopped)?
    }
}
