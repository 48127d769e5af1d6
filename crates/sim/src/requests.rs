//! The schedule's requests: creates, events, replays and operator commands sent to a
//! node, and the world's agent (leases, reports, duplicate and late reports).

use serde_json::json;
use settle_builtin as machines;
use settle_core::Properties;
use settle_engine::Command;
use settle_store::{Op, TaskResult};

use crate::world::{Request, SLEEPER_AFTER, Waiting, World};

impl World {
    pub(crate) fn request(&mut self) {
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

    pub(crate) fn raise(&mut self, n: usize, machine: &str, key: &str, event: &str) {
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
    pub(crate) fn agent_step(&mut self) {
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
    pub(crate) fn agent_heal(&mut self) {
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
    pub(crate) fn lease_tasks(&mut self, n: usize, agent: &str, limit: usize) {
        let token_prefix = self.fresh(&format!("{agent}-"));
        let engine = self.nodes[n].engine.as_mut().expect("live");
        let op = Op::TaskLease { queue: machines::PROVIDER_QUEUE.into(), agent: agent.into(), limit, token_prefix };
        let reply = engine.agent(op);
        self.waiting.push(Waiting::Lease(reply));
    }
}
