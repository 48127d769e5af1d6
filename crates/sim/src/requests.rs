//! The schedule's requests: creates, events, replays and operator commands sent to a
//! node, and the world's agent (leases from every queue, reports, duplicate and late
//! reports).

use serde_json::json;
use settle_builtin as machines;
use settle_core::Properties;
use settle_engine::Command;
use settle_store::{Op, TaskResult};

use crate::machines::CROWD_QUEUE;
use crate::world::{AGENT_LOCK_MS, Request, Waiting, World};

impl World {
    /// A client request to a random node.
    pub(crate) fn request(&mut self) {
        let Some(n) = self.pick_node() else { return };
        let roll = self.rng.below(100);
        let owner = self.nodes[n].engine.as_ref().expect("live").owner().to_string();
        let line = if roll < 30 || self.created.is_empty() {
            self.create(n, &owner)
        } else if roll < 55 {
            self.raise_any(n, &owner)
        } else if roll < 75 && !self.requests.is_empty() {
            self.replay(n, &owner)
        } else {
            self.command(n, &owner)
        };
        if let Some(line) = line {
            self.note(line);
        }
    }

    /// A new server, fan-out parent, sleeper, chart, crowd (or relay with its job), and the
    /// event that starts it.
    fn create(&mut self, n: usize, owner: &str) -> Option<String> {
        let kinds = if self.relays() { 6 } else { 5 };
        let (machine, key, start, properties) = match self.rng.below(kinds) {
            0 => ("server", self.fresh("s"), Some("create"), Properties::new()),
            1 => {
                let mut p = Properties::new();
                p.insert("children".into(), json!(1 + self.rng.below(4)));
                ("fanparent", self.fresh("f"), Some("go"), p)
            }
            2 => ("sleeper", self.fresh("z"), None, Properties::new()),
            3 => ("chart", self.fresh("c"), Some("start"), Properties::new()),
            4 => {
                let mut p = Properties::new();
                p.insert("workers".into(), json!(1 + self.rng.below(5)));
                ("crowd", self.fresh("w"), Some("go"), p)
            }
            _ => {
                // The job the relay raises its sync nested event on, first.
                let key = self.fresh("r");
                self.create_one(n, "job", &key, Properties::new());
                ("relay", key, Some("go"), Properties::new())
            }
        };
        let refused = self.create_one(n, machine, &key, properties);
        if let Some(event) = start {
            self.raise(n, machine, &key, event);
        }
        Some(refused.unwrap_or_else(|| {
            format!("{owner}: create {machine}/{key}{}", start.map(|e| format!(" + {e}")).unwrap_or_default())
        }))
    }

    /// Queues the creation of `machine/key`; why it was refused, if it was.
    fn create_one(&mut self, n: usize, machine: &str, key: &str, properties: Properties) -> Option<String> {
        let request_id = format!("create-{machine}-{key}");
        // The engine plans the entity's first timers when it takes the request.
        self.checker.requested(format!("{machine}/{key}"), self.clock_now());
        let engine = self.nodes[n].engine.as_mut().expect("live");
        let refused = match engine.create(machine, key, properties.clone(), &request_id) {
            Ok(reply) => {
                self.nodes[n].waiting.push(Waiting::Create(reply));
                None
            }
            Err(e) => Some(format!("create {machine}/{key} refused: {e}")),
        };
        self.requests.push(Request::Create { machine: machine.into(), key: key.into(), properties, request_id });
        self.created.push((machine.into(), key.into()));
        refused
    }

    /// Any event of a random entity's machine (or of a server's resource), valid in its
    /// state or not. Not a sleeper's `wake` (its timer raises it, and the check counts
    /// every firing), nor a subscription's event (the check counts those too).
    fn raise_any(&mut self, n: usize, owner: &str) -> Option<String> {
        let (mut machine, mut key) = self.created[self.rng.below(self.created.len() as u64) as usize].clone();
        if machine == "sleeper" || (machine == "server" && self.rng.chance(50)) {
            let (_, server) = self.created.iter().find(|(m, _)| m == "server").cloned()?;
            let kind = machines::RESOURCES[self.rng.below(4) as usize];
            key = format!("{server}-{kind}");
            machine = kind.to_string();
        }
        let events: &[&str] = match machine.as_str() {
            "server" => &["create"],
            "fanparent" | "crowd" | "relay" => &["go"],
            "chart" | "job" => &["start"],
            _ => &["start", "delete"],
        };
        let event = events[self.rng.below(events.len() as u64) as usize];
        self.raise(n, &machine, &key, event);
        Some(format!("{owner}: raise {event} on {machine}/{key}"))
    }

    /// An earlier request again, with its request id: a replay.
    fn replay(&mut self, n: usize, owner: &str) -> Option<String> {
        let r = self.requests[self.rng.below(self.requests.len() as u64) as usize].clone();
        let engine = self.nodes[n].engine.as_mut().expect("live");
        match &r {
            Request::Create { machine, key, properties, request_id } => {
                if let Ok(reply) = engine.create(machine, key, properties.clone(), request_id) {
                    self.nodes[n].waiting.push(Waiting::Create(reply));
                }
                Some(format!("{owner}: replay create {machine}/{key} ({request_id})"))
            }
            Request::Raise { machine, key, event, request_id } => {
                if let Ok(reply) = engine.raise(machine, key, event, json!(null), request_id) {
                    self.nodes[n].waiting.push(Waiting::Raise(r.clone(), reply));
                }
                Some(format!("{owner}: replay {event} on {machine}/{key} ({request_id})"))
            }
        }
    }

    /// An operator command on a random entity, a resource or a worker included: racing
    /// the work under way.
    fn command(&mut self, n: usize, owner: &str) -> Option<String> {
        let (mut machine, mut key) = self.created[self.rng.below(self.created.len() as u64) as usize].clone();
        if machine == "server" && self.rng.chance(50) {
            let kind = machines::RESOURCES[self.rng.below(4) as usize];
            key = format!("{key}-{kind}");
            machine = kind.to_string();
        } else if machine == "crowd" && self.rng.chance(50) {
            machine = if self.rng.chance(50) { "worker" } else { "aworker" }.to_string();
            key = format!("{key}-{}", if machine == "worker" { 0 } else { 1 });
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
            self.nodes[n].waiting.push(Waiting::Command(reply));
        }
        Some(format!("{owner}: {} {machine}/{key}", command.as_str()))
    }

    fn raise(&mut self, n: usize, machine: &str, key: &str, event: &str) {
        let request_id = self.fresh("r");
        let r = Request::Raise { machine: machine.into(), key: key.into(), event: event.into(), request_id };
        let Request::Raise { request_id, .. } = &r else { unreachable!() };
        let engine = self.nodes[n].engine.as_mut().expect("live");
        if let Ok(reply) = engine.raise(machine, key, event, json!(null), request_id) {
            self.nodes[n].waiting.push(Waiting::Raise(r.clone(), reply));
        }
        self.requests.push(r);
    }

    /// The queues the world's agent serves.
    fn queues(&self) -> Vec<&'static str> {
        if self.agents { vec![machines::PROVIDER_QUEUE, CROWD_QUEUE] } else { vec![CROWD_QUEUE] }
    }

    /// The world's agent: leases tasks, or reports one it holds (sometimes twice, sometimes
    /// after its lease expired).
    pub(crate) fn agent_step(&mut self) {
        let Some(n) = self.pick_node() else { return };
        let now = self.clock_now();
        if self.agent_tasks.is_empty() || self.rng.chance(30) {
            let queues = self.queues();
            let queue = queues[self.rng.below(queues.len() as u64) as usize];
            self.lease_tasks(n, "sim-agent", queue, 3);
            self.note(format!("agent leases tasks of `{queue}`"));
            return;
        }
        if self.faults.agent_duplicate && !self.reported.is_empty() && self.rng.chance(15) {
            let (task, token, result) = self.reported[self.rng.below(self.reported.len() as u64) as usize].clone();
            self.report(n, task, &token, result);
            self.fault("agent-duplicate", format!("agent reports task {task} again"));
            return;
        }
        let i = self.rng.below(self.agent_tasks.len() as u64) as usize;
        if now - self.agent_tasks[i].leased_at >= AGENT_LOCK_MS && !self.faults.agent_late {
            // Without late reports, a task whose lease ran out is let go.
            self.agent_tasks.swap_remove(i);
            return;
        }
        let held = self.agent_tasks.swap_remove(i);
        let late = now - held.leased_at >= AGENT_LOCK_MS;
        let roll = self.rng.below(10);
        let result = match held.action.as_str() {
            "provision" => match roll {
                0 => TaskResult::Fail { error: "provider busy".into(), retryable: true },
                1 => complete("failed"),
                _ => complete("provisioned"),
            },
            "work" => match roll {
                0 => complete("broken"),
                1..=3 => TaskResult::Fail { error: "worker busy".into(), retryable: true },
                _ => worked(&held.key),
            },
            _ => complete("gone"),
        };
        self.report(n, held.task, &held.token, result.clone());
        let what = format!("agent reports task {} ({} of {}): {result:?}", held.task, held.action, held.key);
        if late {
            self.fault("agent-late", format!("{what}, after its lease expired"));
        } else {
            self.note(what);
        }
        self.reported.push((held.task, held.token, result));
    }

    /// Queues a report on `task` with `token` on node `n`.
    fn report(&mut self, n: usize, task: i64, token: &str, result: TaskResult) {
        let engine = self.nodes[n].engine.as_mut().expect("live");
        let reply = engine.report(task, token, result);
        self.nodes[n].waiting.push(Waiting::Report { task, token: token.to_string(), reply });
    }

    /// The healing agent: completes every task it holds whose lease runs, and leases more
    /// from every queue.
    pub(crate) fn agent_heal(&mut self) {
        let Some(n) = self.live().first().copied() else { return };
        let now = self.clock_now();
        for held in std::mem::take(&mut self.agent_tasks) {
            if now - held.leased_at >= AGENT_LOCK_MS {
                continue;
            }
            let result = match held.action.as_str() {
                "provision" => complete("provisioned"),
                "work" => worked(&held.key),
                _ => complete("gone"),
            };
            self.report(n, held.task, &held.token, result);
        }
        for queue in self.queues() {
            self.lease_tasks(n, "heal-agent", queue, 16);
        }
    }

    /// Agent `agent` leases up to `limit` tasks of `queue` through node `n`.
    fn lease_tasks(&mut self, n: usize, agent: &str, queue: &str, limit: usize) {
        let token_prefix = self.fresh(&format!("{agent}-"));
        let engine = self.nodes[n].engine.as_mut().expect("live");
        let op = Op::TaskLease { queue: queue.into(), agent: agent.into(), limit, token_prefix };
        let reply = engine.agent(op);
        self.nodes[n].waiting.push(Waiting::Lease(reply));
    }
}

fn complete(target: &str) -> TaskResult {
    TaskResult::complete(target, Properties::new())
}

/// An `aworker` done: its agent's report creates its receipt (a successor) and raises
/// `heard` on its crowd, in the commit of its move.
fn worked(key: &str) -> TaskResult {
    TaskResult::Complete(settle_core::ActionOutcome {
        target: Some("done".into()),
        creates: vec![settle_core::step::Create {
            machine: "receipt".into(),
            key: format!("{key}-receipt").into(),
            properties: Properties::new(),
        }],
        related: vec![settle_core::Broadcast {
            event: "heard".into(),
            on: settle_core::Related::Predecessors,
            params: serde_json::Value::Null,
        }],
        ..settle_core::ActionOutcome::default()
    })
}
