//! One seed's world: its database, the clock, the nodes, the schedule's steps and faults,
//! every batch write checked as it lands, and the healing run that brings everything to
//! rest.

use std::collections::HashMap;
use std::time::Duration;

use settle_builtin::draws::mix;
use settle_builtin::{self as machines, ProviderSettings};
use settle_core::Properties;
use settle_engine::sim::{Reply, SimNode, WriteFault};
use settle_engine::{Command, Config, Engine, ManualClock, Outcome};
use settle_store::{AgentTask, AnyStore, Applied, EntityRow, TaskRefusal};

use crate::backend::SeedDb;
use crate::checker::{Acked, Answer, Checker, Violation};
use crate::faults::Faults;
use crate::observe;

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

/// A request waiting for its batch, on the node it was sent to.
pub(crate) enum Waiting {
    Create(Reply<Option<EntityRow>>),
    Raise(Request, Reply<Option<(i64, i64)>>),
    Command(Reply<Option<EntityRow>>),
    Lease(Reply<Applied>),
    Report { task: i64, token: String, reply: Reply<Applied> },
}

/// One engine node of the world, or the gap a crash left, with its requests waiting for
/// their batch in the order they were sent.
pub(crate) struct Node {
    pub(crate) engine: Option<SimNode<AnyStore>>,
    /// Not stepped before this step (a stall).
    pub(crate) stalled_until: usize,
    pub(crate) generation: u32,
    pub(crate) waiting: Vec<Waiting>,
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
/// How long an agent's lease on a task lasts, at most (the longest `lock`).
pub(crate) const AGENT_LOCK_MS: i64 = 10_000;
/// What the simulated deployment keeps: ended entities a minute (then the periodic job
/// removes them, in rounds of a few), everything else forever (the checker replays
/// request ids and reads agent tasks to the end).
pub(crate) const RETENTION: &str = "ended=1m,operations=forever,tasks=forever,minutes=forever";
/// How often the simulated engines prune, and how many entities a round removes at most.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(20);
pub(crate) const PRUNE_LIMIT: usize = 3;

/// [`RETENTION`] as the engines and the checker read it.
pub(crate) fn retention() -> settle_core::retention::Defaults {
    settle_core::retention::Defaults::BUILT_IN.with(RETENTION).expect("the simulation's retention reads")
}

/// What an agent operation of a batch was answered, in the order the batch applied it.
enum AgentAnswer {
    Leased(Vec<AgentTask>),
    LeaseLost,
    Report { task: i64, token: String, answer: Answer },
    ReportLost { task: i64 },
}

pub(crate) struct World {
    pub(crate) seed: u64,
    pub(crate) faults: Faults,
    pub(crate) rng: Rng,
    pub(crate) db: SeedDb,
    pub(crate) clock: ManualClock,
    /// The scenario's resources are provisioned through agents (queue `provider`).
    pub(crate) agents: bool,
    pub(crate) nodes: Vec<Node>,
    pub(crate) requests: Vec<Request>,
    /// Entities the world created (machine, key).
    pub(crate) created: Vec<(String, String)>,
    pub(crate) agent_tasks: Vec<Held>,
    /// Reports already sent once (to send again).
    pub(crate) reported: Vec<(i64, String, settle_store::TaskResult)>,
    pub(crate) checker: Checker,
    pub(crate) trace: Vec<(usize, String)>,
    pub(crate) step: usize,
    pub(crate) injected: u64,
    pub(crate) next_id: u64,
    /// The last history row the checker read.
    last_history: i64,
    /// Batches written (and checked).
    pub(crate) batches: u64,
}

impl World {
    pub(crate) async fn new(seed: u64, faults: Faults, db: SeedDb) -> anyhow::Result<World> {
        let mut rng = Rng(mix(seed ^ 0x5e77_1e00));
        let clock = ManualClock::new(START_MS);
        let agents = rng.chance(30);
        let nodes = 1 + rng.below(3) as usize;
        let mut w = World {
            seed,
            faults,
            rng,
            db,
            clock,
            agents,
            nodes: Vec::new(),
            requests: Vec::new(),
            created: Vec::new(),
            agent_tasks: Vec::new(),
            reported: Vec::new(),
            checker: Checker::new(&[]),
            trace: Vec::new(),
            step: 0,
            injected: 0,
            next_id: 0,
            last_history: 0,
            batches: 0,
        };
        for i in 0..nodes {
            let engine = w.start_node(i, 0, true).await?;
            w.nodes.push(Node { engine: Some(engine), stalled_until: 0, generation: 0, waiting: Vec::new() });
        }
        let machines = w.nodes[0].engine.as_ref().expect("started").machines();
        w.checker = Checker::new(&machines);
        w.note(format!(
            "seed {seed}: {nodes} node(s), resources {}",
            if agents { "through agents" } else { "in process" }
        ));
        Ok(w)
    }

    /// Whether the world runs `relay` and `job`: a sync nested event is answered by the
    /// node that processes its entity, so only worlds of one node run them.
    pub(crate) fn relays(&self) -> bool {
        self.nodes.len() == 1
    }

    pub(crate) async fn start_node(
        &self,
        index: usize,
        generation: u32,
        reclaim: bool,
    ) -> anyhow::Result<SimNode<AnyStore>> {
        let owner = format!("node{index}.{generation}");
        let config = Config {
            owner: owner.clone(),
            lease: LEASE,
            max_inflight: 64,
            claim_batch: 16,
            poll: Duration::from_secs(1),
            hung_after: Duration::from_secs(24 * 3600),
            supervise_every: Duration::from_secs(10),
            retention: retention(),
            prune_every: PRUNE_EVERY,
            prune_limit: PRUNE_LIMIT,
            clock: std::sync::Arc::new(self.clock.clone()),
            ..Config::default()
        };
        let provider = ProviderSettings {
            fail_rate: 0.2,
            fatal_rate: 0.05,
            seed: self.seed,
            min_latency_ms: 0,
            max_latency_ms: 0,
            timeout_ms: TIMEOUT.as_millis() as u64,
        };
        let mut b = Engine::builder(self.db.node_store(&owner)?).config(config);
        b = if self.agents { machines::bind_server_via_agents(b, TIMEOUT) } else { machines::bind_server(b, provider) };
        b = machines::bind_fanout(b)
            .machine(machines::sleeper(SLEEPER_AFTER))
            .on("sleeper", "rise", |_| async { Ok(Outcome::to("awake")) });
        b = crate::machines::bind_chart(b, self.seed);
        b = crate::machines::bind_crowd(b, self.seed);
        b = crate::machines::bind_relay(b, self.seed);
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

    /// Keeps the first violation found.
    fn violated(&mut self, v: Violation) {
        if self.checker.fatal.is_none() {
            self.checker.fatal = Some(v);
        }
    }

    pub(crate) fn fresh(&mut self, what: &str) -> String {
        self.next_id += 1;
        format!("{what}{}", self.next_id)
    }

    pub(crate) fn clock_now(&self) -> i64 {
        settle_store::Clock::now_ms(&self.clock)
    }

    /// The random schedule, then the healing run; `Err` is the simulation's own failure.
    pub(crate) async fn run(
        &mut self,
        steps: usize,
        stop: &std::sync::atomic::AtomicBool,
    ) -> anyhow::Result<Result<(), Violation>> {
        let stopped = || stop.load(std::sync::atomic::Ordering::Relaxed);
        for step in 1..=steps {
            if stopped() {
                return Ok(Ok(()));
            }
            self.step = step;
            self.one_step().await?;
            if let Some(v) = self.checker.fatal.take() {
                return Ok(Err(v));
            }
        }
        self.step = steps + 1;
        self.heal(stop).await?;
        if stopped() {
            return Ok(Ok(()));
        }
        if let Some(v) = self.checker.fatal.take() {
            return Ok(Err(v));
        }
        let end = observe::end(&self.db.observer, self.clock_now()).await?;
        Ok(self.checker.end(self.step, &end))
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
            85..=92 => self.agent_step(),
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
    async fn crash(&mut self, i: usize) -> anyhow::Result<()> {
        let Some(mut engine) = self.nodes[i].engine.take() else { return Ok(()) };
        let _ = engine.settle(Duration::from_secs(10)).await;
        let held = engine.held();
        let queued = engine.queued();
        drop(engine);
        self.nodes[i].waiting.clear();
        self.fault("crash", format!("node{i} crashes (kill -9) holding {held:?}, {queued} operations unwritten"));
        let generation = self.nodes[i].generation + 1;
        // The only node restarting reclaims every lease at once, as an engine on its own
        // SQLite file does; beside live nodes (or on PostgreSQL), leases expire instead.
        let alone = self.live().is_empty() && self.db.exclusive();
        let engine = self.start_node(i, generation, alone).await?;
        self.nodes[i] = Node { engine: Some(engine), stalled_until: 0, generation, waiting: Vec::new() };
        self.note(format!("node{i} restarts as node{i}.{generation}"));
        Ok(())
    }

    /// Delivers node `i`'s finished work and writes one batch, with the fault drawn.
    async fn step_node(&mut self, i: usize) -> anyhow::Result<()> {
        if self.nodes[i].stalled_until > self.step || self.nodes[i].engine.is_none() {
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
        if (15..=17).contains(&draw) && self.faults.connection_cut {
            let owner = self.nodes[i].engine.as_ref().expect("live").owner().to_string();
            let cut = self.db.cut_connections(&owner).await?;
            if cut > 0 {
                self.fault("connection-cut", format!("{owner}: its {cut} database connections are cut"));
            }
        }
        self.write(i, fault, mid_batch, commit_fail).await
    }

    /// Settles node `i` and writes one batch of it, with `fault` and the armed store
    /// faults; then checks what it did: the commits it landed, the answers its requests
    /// got, what the store holds.
    async fn write(&mut self, i: usize, fault: WriteFault, mid_batch: bool, commit_fail: bool) -> anyhow::Result<()> {
        let engine = self.nodes[i].engine.as_mut().expect("live");
        engine.settle(Duration::from_secs(10)).await.map_err(|h| anyhow::anyhow!("node{i}: no answer from {h:?}"))?;
        let owner = engine.owner().to_string();
        let leases = observe::leases(&self.db.observer).await?;
        self.checker.before_write(leases);
        if mid_batch || commit_fail {
            let (a, c) = (i32::from(mid_batch), i32::from(commit_fail));
            self.db.observer.exec(&format!("UPDATE sim_fault SET armed = {a}, commit_armed = {c}")).await?;
        }
        let now = self.clock_now();
        let engine = self.nodes[i].engine.as_mut().expect("live");
        let wrote = engine.write(fault).await;
        let landed = engine.landed();
        if mid_batch || commit_fail {
            self.db.observer.exec("UPDATE sim_fault SET armed = 0, commit_armed = 0").await?;
        }
        if !wrote {
            return Ok(());
        }
        self.batches += 1;
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
        if let Err(v) = self.checker.landed(self.step, &owner, &landed) {
            self.violated(v);
        }
        self.collect(i, now).await?;
        let seen = observe::seen(&self.db.observer, self.last_history, now).await?;
        if let Some(last) = seen.history.last() {
            self.last_history = last.id;
        }
        if let Err(v) = self.checker.seen(self.step, &seen) {
            self.violated(v);
        }
        if self.checker.entities.pruned_now > 0 {
            let names: Vec<&str> = self.checker.entities.pruned_names().collect();
            self.note(format!("pruned {}", names.join(" ")));
            if let Some((table, id)) = observe::orphan(&self.db.observer).await? {
                self.violated(Violation {
                    step: self.step,
                    what: format!("{table} holds a row of entity #{id}, which pruning removed: half removed"),
                    entities: vec![format!("entity#{id}")],
                });
            }
        }
        Ok(())
    }

    /// Reads the answers node `i`'s batch (written at `now`) gave, in the order it applied
    /// the requests, and checks the agents' against the protocol.
    async fn collect(&mut self, i: usize, now: i64) -> anyhow::Result<()> {
        use tokio::sync::oneshot::error::TryRecvError;
        let mut still = Vec::new();
        let mut answers = Vec::new();
        for w in std::mem::take(&mut self.nodes[i].waiting) {
            match w {
                Waiting::Create(mut rx) => {
                    if let Err(TryRecvError::Empty) = rx.try_recv() {
                        still.push(Waiting::Create(rx));
                    }
                }
                Waiting::Command(mut rx) => {
                    if let Err(TryRecvError::Empty) = rx.try_recv() {
                        still.push(Waiting::Command(rx));
                    }
                }
                Waiting::Raise(r, mut rx) => match rx.try_recv() {
                    Err(TryRecvError::Empty) => still.push(Waiting::Raise(r, rx)),
                    Ok(Ok(Some((inbox_id, _)))) => {
                        if let Request::Raise { machine, key, event, request_id } = r {
                            self.checker.acked.push(Acked { machine, key, event, request_id, inbox_id });
                        }
                    }
                    _ => {}
                },
                Waiting::Lease(mut rx) => match rx.try_recv() {
                    Err(TryRecvError::Empty) => still.push(Waiting::Lease(rx)),
                    Ok(Ok(Applied::Leased(tasks))) => answers.push(AgentAnswer::Leased(tasks)),
                    Ok(_) => answers.push(AgentAnswer::LeaseLost),
                    Err(TryRecvError::Closed) => {}
                },
                Waiting::Report { task, token, mut reply } => match reply.try_recv() {
                    Err(TryRecvError::Empty) => still.push(Waiting::Report { task, token, reply }),
                    Ok(Ok(Applied::Pushed { .. })) => {
                        answers.push(AgentAnswer::Report { task, token, answer: Answer::Applied })
                    }
                    Ok(Ok(Applied::ReportReplayed { .. })) => {
                        answers.push(AgentAnswer::Report { task, token, answer: Answer::Replayed })
                    }
                    Ok(Err(settle_engine::Error::Task(TaskRefusal::Refused { reason, .. }))) => {
                        answers.push(AgentAnswer::Report { task, token, answer: Answer::Refused(reason) })
                    }
                    Ok(_) => answers.push(AgentAnswer::ReportLost { task }),
                    Err(TryRecvError::Closed) => {}
                },
            }
        }
        self.nodes[i].waiting = still;
        if answers.is_empty() {
            return Ok(());
        }
        // The tasks as stored after the batch: for refusals as canceled and lost answers
        // (every leased task, when a lease's answer was lost: its tokens are unknown).
        let mut ids: Vec<i64> = answers
            .iter()
            .filter_map(|a| match a {
                AgentAnswer::Report { task, .. } | AgentAnswer::ReportLost { task } => Some(*task),
                _ => None,
            })
            .collect();
        if answers.iter().any(|a| matches!(a, AgentAnswer::LeaseLost)) {
            let leased = self.db.observer.rows("SELECT id FROM agent_tasks WHERE status = 'leased'", &[]).await?;
            ids.extend(leased.iter().map(|r| r[0].int()));
        }
        let stored = observe::tasks(&self.db.observer, &ids).await?;
        for a in answers {
            match a {
                AgentAnswer::Leased(tasks) => {
                    self.checker.agents.leased(&tasks);
                    for t in tasks {
                        if let Some(token) = t.token {
                            let held = Held {
                                task: t.id,
                                token,
                                key: t.key.to_string(),
                                action: t.action.to_string(),
                                leased_at: now,
                            };
                            self.agent_tasks.push(held);
                        }
                    }
                }
                AgentAnswer::LeaseLost => {
                    for (id, s) in &stored {
                        self.checker.agents.lost(*id, Some(s));
                    }
                }
                AgentAnswer::Report { task, token, answer } => {
                    let after = stored.get(&task);
                    if let Err(what) = self.checker.agents.reported(task, &token, now, &answer, after) {
                        let mut entities = vec![format!("task {task}")];
                        entities.extend(self.checker.agents.entity(task));
                        self.violated(Violation { step: self.step, what, entities });
                    }
                }
                AgentAnswer::ReportLost { task } => self.checker.agents.lost(task, stored.get(&task)),
            }
        }
        Ok(())
    }

    /// Stops the faults and runs the world until nothing is due: every stalled node steps
    /// again, crashed ones are back, paused, sleeping and parked entities are resumed, the
    /// agent completes every task.
    async fn heal(&mut self, stop: &std::sync::atomic::AtomicBool) -> anyhow::Result<()> {
        self.note("heal: faults stop; resume every paused, sleeping or parked entity".into());
        for node in &mut self.nodes {
            node.stalled_until = 0;
        }
        let mut resumed = HashMap::new();
        for round in 0..4_000 {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(());
            }
            self.agent_heal();
            for i in 0..self.nodes.len() {
                if self.nodes[i].engine.is_some() {
                    self.write(i, WriteFault::None, false, false).await?;
                }
            }
            if self.checker.fatal.is_some() {
                return Ok(());
            }
            // After the nodes wrote what they queued (a stalled node's pause, say).
            let resuming = self.resume_stopped(&mut resumed).await?;
            let busy =
                self.nodes.iter().filter_map(|n| n.engine.as_ref()).any(|e| !e.held().is_empty() || e.queued() > 0);
            let waiting = self.nodes.iter().any(|n| !n.waiting.is_empty());
            let (next_due, tasks_open) = observe::pending(&self.db.observer).await?;
            if !busy && !resuming && next_due.is_none() && tasks_open == 0 && !waiting {
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
        self.violated(Violation {
            step: self.step,
            what: "the world did not come to rest within 4000 rounds of healing".into(),
            entities: vec![],
        });
        Ok(())
    }

    /// Resumes entities an operator command or the fault policy stopped (each at most 5
    /// times: one the fault policy parks again and again stays parked); answers whether it
    /// resumed any.
    async fn resume_stopped(&mut self, resumed: &mut HashMap<(String, String), u32>) -> anyhow::Result<bool> {
        let mut any = false;
        for (machine, key) in observe::stopped(&self.db.observer).await? {
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
                self.nodes[n].waiting.push(Waiting::Command(reply));
            }
            self.note(format!("heal: resume {machine}/{key}"));
        }
        Ok(any)
    }

    /// Ends the world: the nodes go, then the database (its directory or schema).
    pub(crate) async fn shutdown(mut self) -> anyhow::Result<()> {
        self.nodes.clear();
        // Let the nodes' tasks see their channels close and let go of their connections.
        tokio::task::yield_now().await;
        self.db.close().await
    }
}
