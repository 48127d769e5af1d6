//! One seed's world: the store, the clock, the nodes, the schedule's steps and faults, and
//! the healing run that brings everything to rest.

use std::collections::HashMap;
use std::time::Duration;

use settle_builtin::draws::mix;
use settle_builtin::{self as machines, ProviderSettings};
use settle_core::Properties;
use settle_engine::sim::{SimNode, WriteFault};
use settle_engine::{Command, Config, Engine, ManualClock, Outcome};
use settle_store::sqlite::SqliteStore;
use settle_store::{Applied, TaskResult};

use crate::chart::bind_chart;
use crate::checker::{Acked, Checker, Violation};
use crate::faults::Faults;

/// A small, fast generator of the seed's random schedule.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = mix(self.0);
        self.0
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What a request was, to check once it is acknowledged.
#[derive(Debug, Clone)]
pub(crate) enum Request {
    Create { machine: String, key: String, properties: Properties, request_id: String },
    Raise { machine: String, key: String, event: String, request_id: String },
}

/// A request waiting for its batch.
pub(crate) enum Waiting {
    Create(settle_engine::sim::Reply<Option<settle_store::EntityRow>>),
    Raise(Request, settle_engine::sim::Reply<Option<(i64, i64)>>),
    Command(settle_engine::sim::Reply<Option<settle_store::EntityRow>>),
    Lease(settle_engine::sim::Reply<Applied>),
    Report(settle_engine::sim::Reply<Applied>),
}

/// One engine node of the world, or the gap a crash left.
pub(crate) struct Node {
    pub(crate) engine: Option<SimNode<SqliteStore>>,
    /// Not stepped before this step (a stall).
    pub(crate) stalled_until: usize,
    pub(crate) generation: u32,
}

/// A task an agent of the world holds.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) task: i64,
    pub(crate) token: String,
    pub(crate) key: String,
    pub(crate) action: String,
    pub(crate) leased_at: i64,
}

pub(crate) const START_MS: i64 = 1_750_000_000_000;
pub(crate) const LEASE: Duration = Duration::from_secs(5);
pub(crate) const SLEEPER_AFTER: Duration = Duration::from_secs(30);
pub(crate) const TIMEOUT: Duration = Duration::from_secs(120);

pub(crate) struct World {
    pub(crate) seed: u64,
    pub(crate) faults: Faults,
    pub(crate) rng: Rng,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) store: SqliteStore,
    pub(crate) observer: rusqlite::Connection,
    pub(crate) clock: ManualClock,
    pub(crate) agents: bool,
    pub(crate) nodes: Vec<Node>,
    pub(crate) waiting: Vec<Waiting>,
    pub(crate) requests: Vec<Request>,
    /// Entities the world created (machine, key).
    pub(crate) created: Vec<(String, String)>,
    pub(crate) agent_tasks: Vec<Held>,
    /// Reports already sent once (to send again).
    pub(crate) reported: Vec<(i64, String, TaskResult)>,
    pub(crate) checker: Checker,
    pub(crate) trace: Vec<(usize, String)>,
    pub(crate) step: usize,
    pub(crate) injected: u64,
    pub(crate) next_id: u64,
}

/// A directory for one seed's database: memory-backed where the system has it (the
/// simulation checks what commits do, not how long fsync takes).
pub(crate) fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }
}

/// A database with Settle's schema and the simulation's fault switch, made once per
/// process and copied for each seed: a seed then starts without running the migrations.
///
/// The switches: while `sim_fault.armed` is 1, inserting a history row aborts the batch's
/// transaction in the middle (a trigger), so the store must roll back what the batch had
/// already written; while `commit_armed` is 1, a chart's entry or exit action's SQL fails,
/// which fails that one commit (the entity backs off and tries again). Arming them changes
/// no schema (cached statements stay prepared). Also `chart_hooks`, the charts' table.
pub(crate) fn template() -> anyhow::Result<&'static std::path::Path> {
    static TEMPLATE: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> = std::sync::OnceLock::new();
    if let Some((_, path)) = TEMPLATE.get() {
        return Ok(path);
    }
    let dir = scratch_dir()?;
    let built = dir.path().join("built.db");
    drop(SqliteStore::open(&built)?);
    let db = rusqlite::Connection::open(&built)?;
    db.execute_batch(settle_builtin::chart::CHART_HOOKS_TABLE)?;
    db.execute_batch(
        "CREATE TABLE sim_fault (armed INTEGER NOT NULL, commit_armed INTEGER NOT NULL);
         INSERT INTO sim_fault VALUES (0, 0);
         CREATE TRIGGER sim_fault BEFORE INSERT ON history WHEN (SELECT armed FROM sim_fault) = 1 BEGIN
             SELECT RAISE(ABORT, 'simulated store failure in the middle of a batch');
         END;
         CREATE TRIGGER sim_commit_fault BEFORE INSERT ON chart_hooks
             WHEN (SELECT commit_armed FROM sim_fault) = 1 BEGIN
             SELECT RAISE(ABORT, 'simulated failure of a commit''s SQL');
         END;",
    )?;
    let path = dir.path().join("template.db");
    db.execute("VACUUM INTO ?1", [path.display().to_string()])?;
    drop(db);
    Ok(&TEMPLATE.get_or_init(|| (dir, path)).1)
}

impl World {
    pub(crate) async fn new(seed: u64, faults: Faults) -> anyhow::Result<World> {
        let mut rng = Rng(mix(seed ^ 0x5e77_1e00));
        let dir = scratch_dir()?;
        let path = dir.path().join("sim.db");
        std::fs::copy(template()?, &path)?;
        let store = SqliteStore::open(&path)?;
        let observer = rusqlite::Connection::open(&path)?;
        observer.busy_timeout(Duration::from_secs(5))?;
        let clock = ManualClock::new(START_MS);
        let agents = rng.chance(30);
        let nodes = 1 + rng.below(3) as usize;
        let mut w = World {
            seed,
            faults,
            rng,
            dir,
            store,
            observer,
            clock,
            agents,
            nodes: Vec::new(),
            waiting: Vec::new(),
            requests: Vec::new(),
            created: Vec::new(),
            agent_tasks: Vec::new(),
            reported: Vec::new(),
            checker: Checker::default(),
            trace: Vec::new(),
            step: 0,
            injected: 0,
            next_id: 0,
        };
        for i in 0..nodes {
            let engine = w.start_node(i, 0, true).await?;
            w.nodes.push(Node { engine: Some(engine), stalled_until: 0, generation: 0 });
        }
        w.note(format!(
            "seed {seed}: {nodes} node(s), resources {}",
            if agents { "through agents" } else { "in process" }
        ));
        Ok(w)
    }

    pub(crate) async fn start_node(
        &self,
        index: usize,
        generation: u32,
        reclaim: bool,
    ) -> anyhow::Result<SimNode<SqliteStore>> {
        let config = Config {
            owner: format!("node{index}.{generation}"),
            lease: LEASE,
            max_inflight: 64,
            claim_batch: 16,
            poll: Duration::from_secs(1),
            hung_after: Duration::from_secs(24 * 3600),
            supervise_every: Duration::from_secs(10),
            clock: std::sync::Arc::new(self.clock.clone()),
        };
        let provider = ProviderSettings {
            fail_rate: 0.2,
            fatal_rate: 0.05,
            seed: self.seed,
            min_latency_ms: 0,
            max_latency_ms: 0,
            timeout_ms: TIMEOUT.as_millis() as u64,
        };
        let mut b = Engine::builder(self.store.clone()).config(config);
        b = if self.agents { machines::bind_server_via_agents(b, TIMEOUT) } else { machines::bind_server(b, provider) };
        b = machines::bind_fanout(b)
            .machine(machines::sleeper(SLEEPER_AFTER))
            .on("sleeper", "rise", |_| async { Ok(Outcome::to("awake")) });
        b = bind_chart(b, self.seed);
        Ok(b.start_sim(reclaim).await?)
    }

    pub(crate) fn note(&mut self, line: String) {
        self.trace.push((self.step, line));
    }

    /// Records an injected fault of kind `kind` (a [`Faults`] name).
    pub(crate) fn fault(&mut self, kind: &str, line: String) {
        self.injected += 1;
        self.trace.push((self.step, format!("FAULT {kind}: {line}")));
    }

    pub(crate) fn fresh(&mut self, what: &str) -> String {
        self.next_id += 1;
        format!("{what}{}", self.next_id)
    }

    /// The random schedule, then the healing run; `Err` is the simulation's own failure.
    pub(crate) async fn run(&mut self, steps: usize) -> anyhow::Result<Result<(), Violation>> {
        for step in 1..=steps {
            self.step = step;
            self.one_step().await?;
            self.collect();
            if let Err(v) = self.checker.check(&self.observer, self.step, false) {
                return Ok(Err(v));
            }
        }
        self.step = steps + 1;
        self.heal().await?;
        if let Err(v) = self.checker.check(&self.observer, self.step, true) {
            return Ok(Err(v));
        }
        Ok(Ok(()))
    }

    pub(crate) fn live(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|i| self.nodes[*i].engine.is_some()).collect()
    }

    /// A node to send a request to (stalled ones too: they queue it).
    pub(crate) fn pick_node(&mut self) -> Option<usize> {
        let live = self.live();
        if live.is_empty() {
            return None;
        }
        Some(live[self.rng.below(live.len() as u64) as usize])
    }

    pub(crate) async fn one_step(&mut self) -> anyhow::Result<()> {
        let roll = self.rng.below(100);
        match roll {
            0..=24 => self.request(),
            25..=64 => {
                let i = self.rng.below(self.nodes.len() as u64) as usize;
                self.step_node(i).await?;
            }
            65..=79 => {
                let ms = 10 + self.rng.below(1_500) as i64;
                self.advance(ms);
            }
            80..=84 => {
                let jump = 5_000 + self.rng.below(120_000) as i64;
                if self.faults.clock_jump {
                    self.fault("clock-jump", format!("clock jumps {jump} ms"));
                    self.advance(jump);
                }
            }
            85..=92 => {
                if self.agents {
                    self.agent_step();
                }
            }
            93..=96 => {
                let i = self.rng.below(self.nodes.len() as u64) as usize;
                let span = 5 + self.rng.below(30) as usize;
                if self.faults.stall && self.nodes[i].engine.is_some() {
                    self.nodes[i].stalled_until = self.step + span;
                    self.fault("stall", format!("node{i} stalls for {span} steps (its leases may expire)"));
                }
            }
            _ => {
                let i = self.rng.below(self.nodes.len() as u64) as usize;
                if self.faults.crash {
                    self.crash(i).await?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn advance(&mut self, ms: i64) {
        self.clock.advance(Duration::from_millis(ms as u64));
        self.note(format!("clock +{ms} ms"));
    }

    /// Crashes node `i` after it ran its handlers, before it writes their commits; a new
    /// node takes its place.
    pub(crate) async fn crash(&mut self, i: usize) -> anyhow::Result<()> {
        let Some(mut engine) = self.nodes[i].engine.take() else { return Ok(()) };
        let _ = engine.settle(Duration::from_secs(10)).await;
        let held = engine.held();
        let queued = engine.queued();
        drop(engine);
        self.fault("crash", format!("node{i} crashes (kill -9) holding {held:?}, {queued} operations unwritten"));
        let generation = self.nodes[i].generation + 1;
        // The only node restarting reclaims every lease at once, as an engine on its own
        // SQLite file does; beside live nodes, leases expire instead.
        let alone = self.live().is_empty();
        let engine = self.start_node(i, generation, alone).await?;
        self.nodes[i] = Node { engine: Some(engine), stalled_until: 0, generation };
        self.note(format!("node{i} restarts as node{i}.{generation}"));
        Ok(())
    }

    /// Delivers node `i`'s finished work and writes one batch, with the fault drawn.
    pub(crate) async fn step_node(&mut self, i: usize) -> anyhow::Result<()> {
        if self.nodes[i].stalled_until > self.step {
            return Ok(());
        }
        let draw = self.rng.below(100);
        let fault = match draw {
            0..=3 if self.faults.write_before => WriteFault::Before,
            4..=6 if self.faults.write_after => WriteFault::After,
            _ => WriteFault::None,
        };
        let mid_batch = (7..=9).contains(&draw) && self.faults.mid_batch;
        let commit_fail = (10..=14).contains(&draw) && self.faults.commit_fail;
        let Some(engine) = self.nodes[i].engine.as_mut() else { return Ok(()) };
        engine.settle(Duration::from_secs(10)).await.map_err(|h| anyhow::anyhow!("node{i}: no answer from {h:?}"))?;
        let owner = engine.owner().to_string();
        if mid_batch {
            self.observer.execute_batch("UPDATE sim_fault SET armed = 1")?;
        }
        if commit_fail {
            self.observer.execute_batch("UPDATE sim_fault SET commit_armed = 1")?;
        }
        let engine = self.nodes[i].engine.as_mut().expect("live");
        let wrote = engine.write(fault).await;
        let landed = engine.landed();
        if mid_batch {
            self.observer.execute_batch("UPDATE sim_fault SET armed = 0")?;
        }
        if commit_fail {
            self.observer.execute_batch("UPDATE sim_fault SET commit_armed = 0")?;
        }
        if !wrote {
            return Ok(());
        }
        match fault {
            WriteFault::Before => {
                self.fault("write-before", format!("{owner}: the batch write fails before the store"))
            }
            WriteFault::After => {
                self.fault("write-after", format!("{owner}: the batch commits but its result is lost"))
            }
            WriteFault::None if commit_fail => self.fault(
                "commit-fail",
                format!("{owner}: the SQL of every chart entry or exit action in the batch fails (that commit alone)"),
            ),
            WriteFault::None if mid_batch => self.fault(
                "mid-batch",
                format!("{owner}: the batch fails in the middle (rolled back if it wrote history)"),
            ),
            WriteFault::None => {}
        }
        if !landed.is_empty() {
            let names: Vec<String> = landed.iter().map(|(id, v)| format!("{}@v{v}", self.checker.name(*id))).collect();
            self.note(format!("{owner} committed {}", names.join(" ")));
        }
        self.record_landed(&owner, landed);
        Ok(())
    }

    /// Records the commits `owner` landed; a version committed twice breaks the single
    /// writer (reported at the next check).
    pub(crate) fn record_landed(&mut self, owner: &str, landed: Vec<(i64, i64)>) {
        for (id, version) in landed {
            if let Some(other) = self.checker.landed.insert((id, version), owner.to_string())
                && self.checker.fatal.is_none()
            {
                let name = self.checker.name(id);
                self.checker.fatal = Some(Violation {
                    step: self.step,
                    what: format!("two writers: {name}: version {version} committed by {other} and by {owner}"),
                    entities: vec![name],
                });
            }
        }
    }

    /// A client request to a random node.
    pub(crate) fn clock_now(&self) -> i64 {
        settle_store::Clock::now_ms(&self.clock)
    }

    pub(crate) fn collect(&mut self) {
        let now = self.clock_now();
        let mut still = Vec::new();
        for w in std::mem::take(&mut self.waiting) {
            match w {
                Waiting::Create(mut rx) | Waiting::Command(mut rx) => {
                    if let Err(tokio::sync::oneshot::error::TryRecvError::Empty) = rx.try_recv() {
                        still.push(Waiting::Create(rx));
                    }
                }
                Waiting::Raise(r, mut rx) => match rx.try_recv() {
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty) => still.push(Waiting::Raise(r, rx)),
                    Ok(Ok(Some((inbox_id, _)))) => {
                        if let Request::Raise { machine, key, event, request_id } = r {
                            self.checker.acked.push(Acked { machine, key, event, request_id, inbox_id });
                        }
                    }
                    _ => {}
                },
                Waiting::Lease(mut rx) => match rx.try_recv() {
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty) => still.push(Waiting::Lease(rx)),
                    Ok(Ok(Applied::Leased(tasks))) => {
                        for t in tasks {
                            if let Some(token) = t.token {
                                self.agent_tasks.push(Held {
                                    task: t.id,
                                    token,
                                    key: t.key.to_string(),
                                    action: t.action.to_string(),
                                    leased_at: now,
                                });
                            }
                        }
                    }
                    _ => {}
                },
                Waiting::Report(mut rx) => {
                    if let Err(tokio::sync::oneshot::error::TryRecvError::Empty) = rx.try_recv() {
                        still.push(Waiting::Report(rx));
                    }
                }
            }
        }
        self.waiting = still;
    }

    /// Stops the faults and runs the world until nothing is due: every stalled node steps
    /// again, crashed ones are back, paused, sleeping and parked entities are resumed, the
    /// agent completes every task.
    pub(crate) async fn heal(&mut self) -> anyhow::Result<()> {
        self.note("heal: faults stop; resume every paused, sleeping or parked entity".into());
        for node in &mut self.nodes {
            node.stalled_until = 0;
        }
        let mut resumed = HashMap::new();
        for round in 0..4_000 {
            if self.agents {
                self.agent_heal();
            }
            for i in 0..self.nodes.len() {
                let Some(engine) = self.nodes[i].engine.as_mut() else { continue };
                engine
                    .settle(Duration::from_secs(10))
                    .await
                    .map_err(|h| anyhow::anyhow!("node{i}: no answer from {h:?}"))?;
                engine.write(WriteFault::None).await;
                let owner = engine.owner().to_string();
                let landed = engine.landed();
                if !landed.is_empty() {
                    let names: Vec<String> =
                        landed.iter().map(|(id, v)| format!("{}@v{v}", self.checker.name(*id))).collect();
                    self.note(format!("{owner} committed {}", names.join(" ")));
                }
                self.record_landed(&owner, landed);
            }
            self.collect();
            if let Err(v) = self.checker.check(&self.observer, self.step, false) {
                self.checker.fatal = Some(v);
                return Ok(());
            }
            // After the nodes wrote what they queued (a stalled node's pause, say).
            let resuming = self.resume_stopped(&mut resumed)?;
            let busy =
                self.nodes.iter().filter_map(|n| n.engine.as_ref()).any(|e| !e.held().is_empty() || e.queued() > 0);
            let next_due: Option<i64> = self.observer.query_row(
                "SELECT MIN(due_at) FROM entities WHERE due_at IS NOT NULL AND run_status NOT IN ('killed')",
                [],
                |r| r.get(0),
            )?;
            let tasks_open: i64 = self.observer.query_row(
                "SELECT COUNT(*) FROM agent_tasks WHERE status IN ('ready', 'leased')",
                [],
                |r| r.get(0),
            )?;
            if !busy && !resuming && next_due.is_none() && tasks_open == 0 && self.waiting.is_empty() {
                self.note(format!("heal: at rest after {round} rounds"));
                return Ok(());
            }
            let now = self.clock_now();
            let step = match next_due {
                Some(due) if due > now && !busy => (due - now).min(60_000),
                _ => 250,
            };
            self.clock.advance(Duration::from_millis(step as u64));
        }
        self.checker.fatal = Some(Violation {
            step: self.step,
            what: "the world did not come to rest within 4000 rounds of healing".into(),
            entities: vec![],
        });
        Ok(())
    }

    /// Resumes entities an operator command or the fault policy stopped (each at most 5
    /// times: one the fault policy parks again and again stays parked); answers whether it
    /// resumed any.
    pub(crate) fn resume_stopped(&mut self, resumed: &mut HashMap<(String, String), u32>) -> anyhow::Result<bool> {
        let mut stmt = self.observer.prepare_cached(
            "SELECT machine, key FROM entities WHERE run_status IN ('paused', 'sleeping', 'fault', 'failed') ORDER BY id",
        )?;
        let rows: Vec<(String, String)> =
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
        drop(stmt);
        let mut any = false;
        for (machine, key) in rows {
            let n = resumed.entry((machine.clone(), key.clone())).or_default();
            if *n >= 5 {
                continue;
            }
            *n += 1;
            any = true;
            let Some(n) = self.live().first().copied() else { break };
            let request_id = self.fresh("heal");
            let engine = self.nodes[n].engine.as_mut().expect("live");
            if let Ok(reply) = engine.command(&machine, &key, Command::Resume, &request_id) {
                self.waiting.push(Waiting::Command(reply));
            }
            self.note(format!("heal: resume {machine}/{key}"));
        }
        Ok(any)
    }

    /// The healing agent: leases every task and completes it.
    pub(crate) async fn shutdown(mut self) {
        self.nodes.clear();
        self.waiting.clear();
        drop(self.observer);
        drop(self.store);
        // Let the nodes' tasks see their channels close and let go of the file.
        tokio::task::yield_now().await;
        drop(self.dir);
    }
}
