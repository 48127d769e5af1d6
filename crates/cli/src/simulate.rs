//! `settle simulate`: deterministic simulation of the engine under faults.
//!
//! Each seed builds a world on a fresh SQLite file: one to three engine nodes
//! ([`settle_engine::sim::SimNode`]: the real scheduler and decisions, stepped), a
//! [`ManualClock`], the reference scenario's machines (servers and their four resources,
//! provisioned in process or through agents), fan-out parents and children, and sleepers
//! with a timer. A random schedule drawn from the seed then interleaves requests (creates,
//! raised events, replays of earlier request ids, operator commands), node steps (deliver
//! the handlers' results, write a batch), clock moves and faults:
//!
//! - a node crashes between its actions and their commit (dropped, with what it held; a
//!   new node takes its place) or stalls while its leases expire and others take over;
//! - a batch write fails before the store sees it, fails after it committed (the result is
//!   lost), or fails in the middle (a trigger aborts the transaction after some of its
//!   statements ran: the store rolls it back);
//! - the clock jumps;
//! - an agent reports twice, or reports after its lease expired and another agent took
//!   the task.
//!
//! After every step the invariants are checked over what the store recorded since the last
//! step (see [`Checker`]); at the end the faults stop, every node is healed, paused or
//! parked entities are resumed, and the world runs until nothing is due, then the end
//! invariants are checked. A failing seed prints the violation, the trace of the steps
//! that touched the entities involved, the faults it still fails without, and the command
//! that replays it.

use std::collections::{HashMap, HashSet};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::json;
use settle_core::Properties;
use settle_engine::sim::{SimNode, WriteFault};
use settle_engine::{Command, Config, Engine, EngineBuilder, ManualClock, Outcome};
use settle_store::sqlite::SqliteStore;
use settle_store::{Applied, Op, TaskResult};

use crate::machines::{self, ProviderSettings};
use crate::sim::{Draws, mix};

/// Options of `settle simulate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// How many seeds to run (from `--from`).
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Run this one seed and print its trace.
    #[arg(long, conflicts_with_all = ["seeds", "from", "for_"])]
    seed: Option<u64>,
    /// Keep running seeds from a random start for this long (e.g. `10m`, `8h`) instead of
    /// `--seeds`.
    #[arg(long = "for", value_name = "DURATION", value_parser = settle_core::duration::parse)]
    for_: Option<Duration>,
    /// With `--seed`: keep the seed's database at this path, to inspect with the other
    /// commands (`settle --db PATH list`, `history`, `ops`).
    #[arg(long, value_name = "PATH", requires = "seed")]
    keep: Option<std::path::PathBuf>,
    /// Steps of each seed's random schedule (before the healing run).
    #[arg(long, default_value_t = 150)]
    steps: usize,
}

/// The faults a run injects; a shrinking run turns them off one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Faults {
    crash: bool,
    stall: bool,
    write_before: bool,
    write_after: bool,
    mid_batch: bool,
    commit_fail: bool,
    clock_jump: bool,
    agent_duplicate: bool,
    agent_late: bool,
}

impl Faults {
    const ALL: Faults = Faults {
        crash: true,
        stall: true,
        write_before: true,
        write_after: true,
        mid_batch: true,
        commit_fail: true,
        clock_jump: true,
        agent_duplicate: true,
        agent_late: true,
    };

    fn names(&self) -> Vec<&'static str> {
        let all = [
            (self.crash, "crash"),
            (self.stall, "stall"),
            (self.write_before, "write-before"),
            (self.write_after, "write-after"),
            (self.mid_batch, "mid-batch"),
            (self.commit_fail, "commit-fail"),
            (self.clock_jump, "clock-jump"),
            (self.agent_duplicate, "agent-duplicate"),
            (self.agent_late, "agent-late"),
        ];
        all.into_iter().filter(|(on, _)| *on).map(|(_, n)| n).collect()
    }

    /// This set without fault `name`.
    fn without(mut self, name: &str) -> Faults {
        match name {
            "crash" => self.crash = false,
            "stall" => self.stall = false,
            "write-before" => self.write_before = false,
            "write-after" => self.write_after = false,
            "mid-batch" => self.mid_batch = false,
            "commit-fail" => self.commit_fail = false,
            "clock-jump" => self.clock_jump = false,
            "agent-duplicate" => self.agent_duplicate = false,
            "agent-late" => self.agent_late = false,
            _ => {}
        }
        self
    }
}

/// A broken invariant: what, where (entities by `machine/key`), at which step.
#[derive(Debug, Clone)]
pub struct Violation {
    step: usize,
    what: String,
    entities: Vec<String>,
}

/// How one seed ended.
struct Ran {
    /// The trace: one line per step (`step N: ...`).
    trace: Vec<(usize, String)>,
    result: Result<Summary, Violation>,
}

/// What a seed did, when it held.
#[derive(Debug, Default, Clone, Copy)]
struct Summary {
    steps: usize,
    entities: u64,
    commits: u64,
    faults: u64,
}

/// Runs `settle simulate`.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // The injected faults would log errors by the thousand: quiet unless SETTLE_LOG asks.
    let _quiet = std::env::var_os("SETTLE_LOG")
        .is_none()
        .then(|| tracing_subscriber::util::SubscriberInitExt::set_default(tracing_subscriber::registry()));
    if let Some(seed) = args.seed {
        let ran = run_seed_keeping(seed, args.steps, Faults::ALL, args.keep.as_deref()).await?;
        for (_, line) in &ran.trace {
            println!("{line}");
        }
        return Ok(match ran.result {
            Ok(s) => {
                println!(
                    "seed {seed}: every invariant held ({} steps, {} entities, {} commits, {} faults)",
                    s.steps, s.entities, s.commits, s.faults
                );
                ExitCode::SUCCESS
            }
            Err(v) => {
                report_failure(seed, args.steps, &v, &ran.trace).await?;
                ExitCode::FAILURE
            }
        });
    }
    let started = Instant::now();
    let first = match args.for_ {
        Some(_) => mix(settle_store::clock::now_ms() as u64) % 1_000_000_000,
        None => args.from,
    };
    let mut total = Summary::default();
    let mut last_progress = Instant::now();
    let mut seed = first;
    loop {
        let done = seed - first;
        match args.for_ {
            Some(limit) if started.elapsed() >= limit => break,
            None if done >= args.seeds => break,
            _ => {}
        }
        let ran = run_seed(seed, args.steps, Faults::ALL).await?;
        match ran.result {
            Ok(s) => {
                total.steps += s.steps;
                total.entities += s.entities;
                total.commits += s.commits;
                total.faults += s.faults;
            }
            Err(v) => {
                eprintln!("seed {seed}: invariant violated after {done} seeds that held");
                report_failure(seed, args.steps, &v, &ran.trace).await?;
                return Ok(ExitCode::FAILURE);
            }
        }
        seed += 1;
        if last_progress.elapsed() >= Duration::from_secs(5) {
            last_progress = Instant::now();
            eprintln!(
                "simulate: {} seeds held ({first}..{seed}), {:.0}s, {} commits, {} faults injected",
                seed - first,
                started.elapsed().as_secs_f64(),
                total.commits,
                total.faults
            );
        }
    }
    println!(
        "simulate: seeds {first}..{seed}: every invariant held ({} seeds, {} steps, {} entities, {} commits, {} faults injected, {:.1}s)",
        seed - first,
        total.steps,
        total.entities,
        total.commits,
        total.faults,
        started.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// Prints a failing seed: the violation, the trace of the steps touching its entities, the
/// faults it still fails without, and the command that replays it.
async fn report_failure(seed: u64, steps: usize, v: &Violation, trace: &[(usize, String)]) -> anyhow::Result<()> {
    println!("seed {seed}: INVARIANT VIOLATED at step {}: {}", v.step, v.what);
    // Shrink: drop each fault kind in turn while the seed still fails.
    let mut faults = Faults::ALL;
    for name in Faults::ALL.names() {
        let fewer = faults.without(name);
        if run_seed(seed, steps, fewer).await?.result.is_err() {
            faults = fewer;
        }
    }
    let needed = faults.names();
    println!(
        "faults it needs: {}",
        if needed.is_empty() { "none (it fails without any injected fault)".to_string() } else { needed.join(", ") }
    );
    println!("trace (the steps that touched {}, and the faults of the kinds it needs):", v.entities.join(", "));
    let tags: Vec<String> = needed.iter().map(|n| format!("FAULT {n}:")).collect();
    for (step, line) in trace.iter().filter(|(s, _)| *s <= v.step) {
        let relevant = v.entities.iter().any(|e| line.contains(e.as_str())) || tags.iter().any(|t| line.starts_with(t));
        if relevant {
            println!("  {step:>4} {line}");
        }
    }
    println!("replay: settle simulate --seed {seed} --steps {steps}");
    Ok(())
}

/// A small, fast generator of the seed's random schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = mix(self.0);
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What a request was, to check once it is acknowledged.
#[derive(Debug, Clone)]
enum Request {
    Create { machine: String, key: String, properties: Properties, request_id: String },
    Raise { machine: String, key: String, event: String, request_id: String },
}

/// A request waiting for its batch.
enum Waiting {
    Create(settle_engine::sim::Reply<Option<settle_store::EntityRow>>),
    Raise(Request, settle_engine::sim::Reply<Option<(i64, i64)>>),
    Command(settle_engine::sim::Reply<Option<settle_store::EntityRow>>),
    Lease(settle_engine::sim::Reply<Applied>),
    Report(settle_engine::sim::Reply<Applied>),
}

/// One engine node of the world, or the gap a crash left.
struct Node {
    engine: Option<SimNode<SqliteStore>>,
    /// Not stepped before this step (a stall).
    stalled_until: usize,
    generation: u32,
}

/// A task an agent of the world holds.
#[derive(Debug, Clone)]
struct Held {
    task: i64,
    token: String,
    key: String,
    action: String,
    leased_at: i64,
}

const START_MS: i64 = 1_750_000_000_000;
const LEASE: Duration = Duration::from_secs(5);
const SLEEPER_AFTER: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_secs(120);

struct World {
    seed: u64,
    faults: Faults,
    rng: Rng,
    dir: tempfile::TempDir,
    store: SqliteStore,
    observer: rusqlite::Connection,
    clock: ManualClock,
    agents: bool,
    nodes: Vec<Node>,
    waiting: Vec<Waiting>,
    requests: Vec<Request>,
    /// Entities the world created (machine, key).
    created: Vec<(String, String)>,
    agent_tasks: Vec<Held>,
    /// Reports already sent once (to send again).
    reported: Vec<(i64, String, TaskResult)>,
    checker: Checker,
    trace: Vec<(usize, String)>,
    step: usize,
    injected: u64,
    next_id: u64,
}

/// A directory for one seed's database: memory-backed where the system has it (the
/// simulation checks what commits do, not how long fsync takes).
fn scratch_dir() -> std::io::Result<tempfile::TempDir> {
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
fn template() -> anyhow::Result<&'static std::path::Path> {
    static TEMPLATE: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> = std::sync::OnceLock::new();
    if let Some((_, path)) = TEMPLATE.get() {
        return Ok(path);
    }
    let dir = scratch_dir()?;
    let built = dir.path().join("built.db");
    drop(SqliteStore::open(&built)?);
    let db = rusqlite::Connection::open(&built)?;
    db.execute_batch(crate::workload::CHART_HOOKS_TABLE)?;
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

/// `chart` (the crash workload's statechart: `working` with three substeps, each with
/// entry and exit actions) with handlers that answer at once: a step retries a fifth of
/// the time (drawn from the seed and the attempt), and every entry and exit action inserts
/// its row into `chart_hooks` in the transition's commit.
fn bind_chart(mut b: EngineBuilder<SqliteStore>, seed: u64) -> EngineBuilder<SqliteStore> {
    b = b.machine(crate::workload::chart());
    for (action, next) in [("work1", "step2"), ("work2", "step3"), ("work3", "done")] {
        b = b.on("chart", action, move |ctx| async move {
            if Draws::new(seed, &ctx.idempotency_key()).next_f64() < 0.2 {
                return Ok(Outcome::retry_after(Duration::from_millis(200)));
            }
            Ok(Outcome::to(next))
        });
    }
    for hook in ["enter_working", "leave_working", "enter_step", "leave_step"] {
        b = b.on("chart", hook, move |ctx| async move {
            Ok(Outcome::stay().sql(
                "INSERT INTO chart_hooks (key, hook, state) VALUES ($1, $2, $3)",
                [json!(ctx.key.to_string()), json!(hook), json!(ctx.state.to_string())],
            ))
        });
    }
    b
}

/// The entry and exit actions a chart that went from `idle` to `done` ran, each once:
/// (hook, state), sorted.
const CHART_HOOKS: [(&str, &str); 8] = [
    ("enter_step", "step1"),
    ("enter_step", "step2"),
    ("enter_step", "step3"),
    ("enter_working", "working"),
    ("leave_step", "step1"),
    ("leave_step", "step2"),
    ("leave_step", "step3"),
    ("leave_working", "working"),
];

/// Runs one seed with `faults`.
async fn run_seed(seed: u64, steps: usize, faults: Faults) -> anyhow::Result<Ran> {
    run_seed_keeping(seed, steps, faults, None).await
}

/// Runs one seed with `faults`, copying its database to `keep` at the end.
async fn run_seed_keeping(
    seed: u64,
    steps: usize,
    faults: Faults,
    keep: Option<&std::path::Path>,
) -> anyhow::Result<Ran> {
    let mut w = World::new(seed, faults).await?;
    let result = w.run(steps).await;
    if let Some(path) = keep {
        let _ = std::fs::remove_file(path);
        w.observer.execute("VACUUM INTO ?1", [path.display().to_string()])?;
    }
    let trace = std::mem::take(&mut w.trace);
    let result = match result {
        Ok(Ok(())) => Ok(Summary {
            steps: w.step,
            entities: w.checker.entities.len() as u64,
            commits: w.checker.landed.len() as u64,
            faults: w.injected,
        }),
        Ok(Err(v)) => Err(v),
        Err(e) => Err(Violation { step: w.step, what: format!("the simulation failed: {e:#}"), entities: vec![] }),
    };
    w.shutdown().await;
    Ok(Ran { trace, result })
}

impl World {
    async fn new(seed: u64, faults: Faults) -> anyhow::Result<World> {
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

    async fn start_node(&self, index: usize, generation: u32, reclaim: bool) -> anyhow::Result<SimNode<SqliteStore>> {
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

    fn note(&mut self, line: String) {
        self.trace.push((self.step, line));
    }

    /// Records an injected fault of kind `kind` (a [`Faults`] name).
    fn fault(&mut self, kind: &str, line: String) {
        self.injected += 1;
        self.trace.push((self.step, format!("FAULT {kind}: {line}")));
    }

    fn fresh(&mut self, what: &str) -> String {
        self.next_id += 1;
        format!("{what}{}", self.next_id)
    }

    /// The random schedule, then the healing run; `Err` is the simulation's own failure.
    async fn run(&mut self, steps: usize) -> anyhow::Result<Result<(), Violation>> {
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

    fn live(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|i| self.nodes[*i].engine.is_some()).collect()
    }

    /// A node to send a request to (stalled ones too: they queue it).
    fn pick_node(&mut self) -> Option<usize> {
        let live = self.live();
        if live.is_empty() {
            return None;
        }
        Some(live[self.rng.below(live.len() as u64) as usize])
    }

    async fn one_step(&mut self) -> anyhow::Result<()> {
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

    fn advance(&mut self, ms: i64) {
        self.clock.advance(Duration::from_millis(ms as u64));
        self.note(format!("clock +{ms} ms"));
    }

    /// Crashes node `i` after it ran its handlers, before it writes their commits; a new
    /// node takes its place.
    async fn crash(&mut self, i: usize) -> anyhow::Result<()> {
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
    async fn step_node(&mut self, i: usize) -> anyhow::Result<()> {
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
    fn record_landed(&mut self, owner: &str, landed: Vec<(i64, i64)>) {
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
    fn request(&mut self) {
        let Some(n) = self.pick_node() else { return };
        let roll = self.rng.below(100);
        let engine = self.nodes[n].engine.as_mut().expect("live");
        let owner = engine.owner().to_string();
        let mut line = None;
        if roll < 30 || self.created.is_empty() {
            // A new server, fan-out parent, sleeper or chart, and the event that starts it.
            let kind = self.rng.below(4);
            let (machine, key, start, properties) = match kind {
                0 => ("server", self.fresh("s"), Some("create"), Properties::new()),
                1 => {
                    let mut p = Properties::new();
                    p.insert("children".into(), json!(1 + self.rng.below(4)));
                    ("fanparent", self.fresh("f"), Some("go"), p)
                }
                2 => ("sleeper", self.fresh("z"), None, Properties::new()),
                _ => ("chart", self.fresh("c"), Some("start"), Properties::new()),
            };
            let request_id = format!("create-{key}");
            if machine == "sleeper" {
                // The engine plans the timer when it takes the request.
                let due = self.clock_now() + SLEEPER_AFTER.as_millis() as i64;
                self.checker.sleeper_due.insert(format!("sleeper/{key}"), due);
            }
            let engine = self.nodes[n].engine.as_mut().expect("live");
            match engine.create(machine, &key, properties.clone(), &request_id) {
                Ok(reply) => self.waiting.push(Waiting::Create(reply)),
                Err(e) => line = Some(format!("create {machine}/{key} refused: {e}")),
            }
            self.requests.push(Request::Create { machine: machine.into(), key: key.clone(), properties, request_id });
            self.created.push((machine.into(), key.clone()));
            if let Some(event) = start {
                self.raise(n, machine, &key, event);
            }
            line.get_or_insert(format!(
                "{owner}: create {machine}/{key}{}",
                start.map(|e| format!(" + {e}")).unwrap_or_default()
            ));
        } else if roll < 55 {
            // Any event of the entity's machine, allowed in its state or not.
            // (Not a sleeper's `wake`: its timer raises that, and the check counts it.)
            let (mut machine, mut key) = self.created[self.rng.below(self.created.len() as u64) as usize].clone();
            if machine == "sleeper" || (machine == "server" && self.rng.chance(50)) {
                let server = self.created.iter().find(|(m, _)| m == "server").cloned();
                let Some((_, server)) = server else { return };
                let kind = machines::RESOURCES[self.rng.below(4) as usize];
                key = format!("{server}-{kind}");
                machine = kind.to_string();
            }
            let events: &[&str] = match machine.as_str() {
                "server" => &["create"],
                "fanparent" => &["go"],
                "chart" => &["start"],
                _ => &["start", "delete"],
            };
            let event = events[self.rng.below(events.len() as u64) as usize];
            self.raise(n, &machine, &key, event);
            line = Some(format!("{owner}: raise {event} on {machine}/{key}"));
        } else if roll < 75 && !self.requests.is_empty() {
            // An earlier request again, with its request id: a replay.
            let r = self.requests[self.rng.below(self.requests.len() as u64) as usize].clone();
            let engine = self.nodes[n].engine.as_mut().expect("live");
            match &r {
                Request::Create { machine, key, properties, request_id } => {
                    if let Ok(reply) = engine.create(machine, key, properties.clone(), request_id) {
                        self.waiting.push(Waiting::Create(reply));
                    }
                    line = Some(format!("{owner}: replay create {machine}/{key} ({request_id})"));
                }
                Request::Raise { machine, key, event, request_id } => {
                    if let Ok(reply) = engine.raise(machine, key, event, json!(null), request_id) {
                        self.waiting.push(Waiting::Raise(r.clone(), reply));
                    }
                    line = Some(format!("{owner}: replay {event} on {machine}/{key} ({request_id})"));
                }
            }
        } else {
            // An operator command on a random entity, a resource included.
            let (mut machine, mut key) = self.created[self.rng.below(self.created.len() as u64) as usize].clone();
            if machine == "server" && self.rng.chance(50) {
                let kind = machines::RESOURCES[self.rng.below(4) as usize];
                key = format!("{key}-{kind}");
                machine = kind.to_string();
            }
            let now = self.clock_now();
            let command = match self.rng.below(12) {
                0..=2 => Command::Pause,
                3..=5 => Command::Resume,
                6..=7 => Command::Retry,
                8..=9 => Command::Release,
                10 => Command::Sleep { until: now + self.rng.below(20_000) as i64 },
                _ => Command::Kill,
            };
            let request_id = self.fresh("cmd");
            let engine = self.nodes[n].engine.as_mut().expect("live");
            if let Ok(reply) = engine.command(&machine, &key, command, &request_id) {
                self.waiting.push(Waiting::Command(reply));
            }
            line = Some(format!("{owner}: {} {machine}/{key}", command.as_str()));
        }
        if let Some(line) = line {
            self.note(line);
        }
    }

    fn clock_now(&self) -> i64 {
        settle_store::Clock::now_ms(&self.clock)
    }

    fn raise(&mut self, n: usize, machine: &str, key: &str, event: &str) {
        let request_id = self.fresh("r");
        let r = Request::Raise { machine: machine.into(), key: key.into(), event: event.into(), request_id };
        let Request::Raise { request_id, .. } = &r else { unreachable!() };
        let engine = self.nodes[n].engine.as_mut().expect("live");
        if let Ok(reply) = engine.raise(machine, key, event, json!(null), request_id) {
            self.waiting.push(Waiting::Raise(r.clone(), reply));
        }
        self.requests.push(r);
    }

    /// The world's agent: leases provider tasks, or reports one it holds (sometimes twice,
    /// sometimes after its lease expired).
    fn agent_step(&mut self) {
        let Some(n) = self.pick_node() else { return };
        let now = self.clock_now();
        if self.agent_tasks.is_empty() || self.rng.chance(30) {
            self.lease_tasks(n, "sim-agent", 3);
            self.note("agent leases tasks".into());
            return;
        }
        if self.faults.agent_duplicate && !self.reported.is_empty() && self.rng.chance(15) {
            let (task, token, result) = self.reported[self.rng.below(self.reported.len() as u64) as usize].clone();
            let engine = self.nodes[n].engine.as_mut().expect("live");
            let reply = engine.agent(Op::TaskReport { task, token, result });
            self.waiting.push(Waiting::Report(reply));
            self.fault("agent-duplicate", format!("agent reports task {task} again"));
            return;
        }
        let i = self.rng.below(self.agent_tasks.len() as u64) as usize;
        let lock_ms = 10_000;
        if now - self.agent_tasks[i].leased_at >= lock_ms && !self.faults.agent_late {
            // Without late reports, a task whose lease ran out is let go.
            self.agent_tasks.swap_remove(i);
            return;
        }
        let held = self.agent_tasks.swap_remove(i);
        let late = now - held.leased_at >= lock_ms;
        let result = match held.action.as_str() {
            "provision" => match self.rng.below(10) {
                0 => TaskResult::Fail { error: "provider busy".into(), retryable: true },
                1 => TaskResult::Complete { target: "failed".into(), properties: Properties::new() },
                _ => TaskResult::Complete { target: "provisioned".into(), properties: Properties::new() },
            },
            _ => TaskResult::Complete { target: "gone".into(), properties: Properties::new() },
        };
        let engine = self.nodes[n].engine.as_mut().expect("live");
        let reply = engine.agent(Op::TaskReport { task: held.task, token: held.token.clone(), result: result.clone() });
        self.waiting.push(Waiting::Report(reply));
        let what = format!("agent reports task {} ({} of {}): {result:?}", held.task, held.action, held.key);
        if late {
            self.fault("agent-late", format!("{what}, after its lease expired"));
        } else {
            self.note(what);
        }
        self.reported.push((held.task, held.token, result));
    }

    /// Reads the replies their batches answered.
    fn collect(&mut self) {
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
    async fn heal(&mut self) -> anyhow::Result<()> {
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
    fn resume_stopped(&mut self, resumed: &mut HashMap<(String, String), u32>) -> anyhow::Result<bool> {
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
    fn agent_heal(&mut self) {
        let Some(n) = self.live().first().copied() else { return };
        let now = self.clock_now();
        for held in std::mem::take(&mut self.agent_tasks) {
            if now - held.leased_at >= 10_000 {
                continue;
            }
            let target = if held.action == "provision" { "provisioned" } else { "gone" };
            let result = TaskResult::Complete { target: target.into(), properties: Properties::new() };
            let engine = self.nodes[n].engine.as_mut().expect("live");
            let reply = engine.agent(Op::TaskReport { task: held.task, token: held.token, result });
            self.waiting.push(Waiting::Report(reply));
        }
        self.lease_tasks(n, "heal-agent", 16);
    }

    /// Agent `agent` leases up to `limit` provider tasks through node `n`.
    fn lease_tasks(&mut self, n: usize, agent: &str, limit: usize) {
        let token_prefix = self.fresh(&format!("{agent}-"));
        let engine = self.nodes[n].engine.as_mut().expect("live");
        let op = Op::TaskLease { queue: machines::PROVIDER_QUEUE.into(), agent: agent.into(), limit, token_prefix };
        let reply = engine.agent(op);
        self.waiting.push(Waiting::Lease(reply));
    }

    async fn shutdown(mut self) {
        self.nodes.clear();
        self.waiting.clear();
        drop(self.observer);
        drop(self.store);
        // Let the nodes' tasks see their channels close and let go of the file.
        tokio::task::yield_now().await;
        drop(self.dir);
    }
}

/// An event the store acknowledged (its inbox id).
#[derive(Debug, Clone)]
struct Acked {
    machine: String,
    key: String,
    event: String,
    request_id: String,
    inbox_id: i64,
}

/// The invariants, checked over the store's history as it grows.
///
/// After every step:
/// - single writer: no (entity, version) is committed by two nodes (each node reports the
///   commits that landed);
/// - history chains unbroken: an entity's first row is its creation, and each row that
///   names the state it started from names the state the previous entry entered;
/// - no event processed twice: each entity has as many history rows that processed an
///   event (`event`, `rejected`, `internal`, `ignored`) as `events` rows, which are keyed
///   by the event's inbox id;
/// - timers fire once per due time and never early: a sleeper's `wake` comes at most once,
///   not before its creation plus its delay.
///
/// At the end, with every node at rest:
/// - every acknowledged event was processed (its `events` row exists; killed entities
///   excepted), and no inbox holds an event of a live entity;
/// - every operation ended;
/// - every sleeper not killed woke;
/// - every chart that reached `done` ran each of its entry and exit actions once (its rows
///   in `chart_hooks`, written in the transitions' commits).
#[derive(Default)]
struct Checker {
    last_history: i64,
    /// The state each entity entered last, by id.
    entities: HashMap<i64, Option<String>>,
    names: HashMap<i64, String>,
    /// History rows that processed an event, by entity id.
    processed: HashMap<i64, u32>,
    /// Sleepers' `wake` rows, by entity id.
    woke: HashMap<i64, u32>,
    /// When each sleeper's timer is due (`sleeper/KEY`): its create request's time plus
    /// the delay.
    sleeper_due: HashMap<String, i64>,
    landed: HashMap<(i64, i64), String>,
    acked: Vec<Acked>,
    fatal: Option<Violation>,
}

impl Checker {
    fn name(&self, id: i64) -> String {
        self.names.get(&id).cloned().unwrap_or_else(|| format!("entity#{id}"))
    }

    fn check(&mut self, db: &rusqlite::Connection, step: usize, end: bool) -> Result<(), Violation> {
        if let Some(v) = self.fatal.take() {
            return Err(v);
        }
        let fail = |what: String, entities: Vec<String>| Violation { step, what, entities };
        let rows =
            read_history(db, self.last_history).map_err(|e| fail(format!("cannot read history: {e}"), vec![]))?;
        for h in rows {
            self.last_history = h.id;
            let name = format!("{}/{}", h.machine, h.key);
            self.names.entry(h.entity_id).or_insert_with(|| name.clone());
            let seen = self.entities.get(&h.entity_id).cloned();
            if h.kind == "create" {
                if seen.is_some() {
                    return Err(fail(format!("{name}: created twice (history row {})", h.id), vec![name]));
                }
            } else {
                let Some(current) = seen else {
                    return Err(fail(
                        format!("{name}: history row {} ({}) before its creation", h.id, h.kind),
                        vec![name],
                    ));
                };
                if let (Some(from), Some(current)) = (&h.from, &current)
                    && from != current
                {
                    return Err(fail(
                        format!(
                            "{name}: history chain broken at row {}: a {} from `{from}` while the entity was in `{current}`",
                            h.id, h.kind
                        ),
                        vec![name],
                    ));
                }
            }
            let entered = h.to.clone().or(self.entities.get(&h.entity_id).cloned().flatten());
            self.entities.insert(h.entity_id, entered);
            if matches!(h.kind.as_str(), "event" | "rejected" | "internal" | "ignored") && h.event.is_some() {
                *self.processed.entry(h.entity_id).or_default() += 1;
            }
            if h.machine == "sleeper" && h.event.as_deref() == Some("wake") && h.kind == "event" {
                let n = self.woke.entry(h.entity_id).or_default();
                *n += 1;
                if *n > 1 {
                    return Err(fail(format!("{name}: its timer fired {n} times for one due time"), vec![name]));
                }
                let due = self.sleeper_due.get(&name).copied().unwrap_or(i64::MAX);
                if h.at < due {
                    return Err(fail(
                        format!("{name}: its timer fired at {} before it was due ({due})", h.at),
                        vec![name],
                    ));
                }
            }
        }
        // Each event processed is one `events` row (keyed by its inbox id) and one history
        // row: more history rows than events means an event was processed twice. (An event
        // whose action failed is consumed by a `fault` row and marked `failed`.)
        let events: Vec<(i64, i64)> = db
            .prepare_cached("SELECT entity_id, COUNT(*) FROM events WHERE NOT failed GROUP BY entity_id")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        let events: HashMap<i64, i64> = events.into_iter().collect();
        for (id, rows) in &self.processed {
            let n = events.get(id).copied().unwrap_or(0);
            if i64::from(*rows) != n {
                let name = self.name(*id);
                return Err(fail(
                    format!("{name}: {rows} history rows processed an event, but {n} events were processed"),
                    vec![name],
                ));
            }
        }
        // A chart's entry and exit actions insert their rows in their transition's commit:
        // one committed twice, or apart from it, shows as a row twice.
        let twice: Option<(String, String, String)> = db
            .prepare_cached("SELECT key, hook, state FROM chart_hooks GROUP BY key, hook, state HAVING COUNT(*) > 1")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.next().transpose())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        if let Some((key, hook, state)) = twice {
            let name = format!("chart/{key}");
            return Err(fail(format!("{name}: `{hook}` of `{state}` ran into the store twice"), vec![name]));
        }
        if !end {
            return Ok(());
        }
        let done: Vec<String> = db
            .prepare("SELECT key FROM entities WHERE machine = 'chart' AND state = 'done' ORDER BY id")
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        let expected: Vec<(String, String)> =
            CHART_HOOKS.iter().map(|(h, st)| (h.to_string(), st.to_string())).collect();
        for key in done {
            let ran: Vec<(String, String)> = db
                .prepare_cached("SELECT hook, state FROM chart_hooks WHERE key = ?1 ORDER BY hook, state")
                .and_then(|mut s| s.query_map([&key], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
                .map_err(|e| fail(e.to_string(), vec![]))?;
            if ran != expected {
                let name = format!("chart/{key}");
                return Err(fail(format!("{name}: done, but its entry and exit actions wrote {ran:?}"), vec![name]));
            }
        }
        let killed = killed(db).map_err(|e| fail(e.to_string(), vec![]))?;
        for a in &self.acked {
            let name = format!("{}/{}", a.machine, a.key);
            let processed: bool = db
                .query_row("SELECT COUNT(*) > 0 FROM events WHERE id = ?1", [a.inbox_id], |r| r.get(0))
                .map_err(|e| fail(e.to_string(), vec![]))?;
            if !processed && !killed.contains(&name) {
                return Err(fail(
                    format!(
                        "{name}: acknowledged event `{}` (request {}, inbox {}) was never processed",
                        a.event, a.request_id, a.inbox_id
                    ),
                    vec![name],
                ));
            }
        }
        let open: Vec<(String, String, Option<String>, Option<String>)> = db
            .prepare("SELECT request_id, name, machine, entity_key FROM operations WHERE ended_at IS NULL ORDER BY id")
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?.collect())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        if let Some((request_id, op, machine, key)) = open.first() {
            let name = format!("{}/{}", machine.as_deref().unwrap_or("?"), key.as_deref().unwrap_or("?"));
            return Err(fail(
                format!("operation {op} ({request_id}) never ended ({} operations open at rest)", open.len()),
                vec![name],
            ));
        }
        let queued: Vec<(String, String, String)> = db
            .prepare(
                "SELECT e.machine, e.key, i.event FROM inbox i JOIN entities e ON e.id = i.entity_id \
                 WHERE e.run_status <> 'killed' ORDER BY i.id",
            )
            .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        if let Some((m, k, e)) = queued.first() {
            let name = format!("{m}/{k}");
            return Err(fail(format!("{name}: event `{e}` still queued at rest"), vec![name]));
        }
        let asleep: Vec<String> = db
            .prepare(
                "SELECT key FROM entities WHERE machine = 'sleeper' AND state = 'asleep' AND run_status <> 'killed'",
            )
            .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
            .map_err(|e| fail(e.to_string(), vec![]))?;
        if let Some(k) = asleep.first() {
            let name = format!("sleeper/{k}");
            return Err(fail(format!("{name}: its timer never fired"), vec![name]));
        }
        Ok(())
    }
}

/// A history row with its entity's names and creation time.
struct Row {
    id: i64,
    entity_id: i64,
    machine: String,
    key: String,
    from: Option<String>,
    to: Option<String>,
    kind: String,
    event: Option<String>,
    at: i64,
}

fn read_history(db: &rusqlite::Connection, after: i64) -> rusqlite::Result<Vec<Row>> {
    let mut stmt = db.prepare_cached(
        "SELECT h.id, h.entity_id, e.machine, e.key, h.from_state, h.to_state, h.kind, h.event, \
         h.at FROM history h JOIN entities e ON e.id = h.entity_id WHERE h.id > ?1 ORDER BY h.id",
    )?;
    stmt.query_map([after], |r| {
        Ok(Row {
            id: r.get(0)?,
            entity_id: r.get(1)?,
            machine: r.get(2)?,
            key: r.get(3)?,
            from: r.get(4)?,
            to: r.get(5)?,
            kind: r.get(6)?,
            event: r.get(7)?,
            at: r.get(8)?,
        })
    })?
    .collect()
}

fn killed(db: &rusqlite::Connection) -> rusqlite::Result<HashSet<String>> {
    let mut stmt = db.prepare("SELECT machine, key FROM entities WHERE run_status = 'killed'")?;
    stmt.query_map([], |r| Ok(format!("{}/{}", r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?.collect()
}
