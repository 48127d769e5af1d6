//! Model-based property test: random valid machines and random event sequences must give
//! the same outcomes, final states and history in the real runtime (an [`Engine`] on a
//! SQLite file) as in the small reference model below.
//!
//! The model is written from the semantics in DESIGN.md §1-§2 and deliberately does not
//! use `settle_core::step`, so the test checks both the step function and the runtime.
//! Handlers are deterministic: the target an action picks is a hash of (state, event or
//! `auto`, retry count) modulo the number of declared targets, and some auto handlers ask
//! for a retry while the retry count is below a small bound.
//!
//! Each entity runs a script of steps, entities concurrently. A step either raises one
//! event and waits for the entity to be at rest, or (when the model says the event enters
//! an unstable state whose auto handler can be held at a gate) raises a second event while
//! that auto action runs, to check that queued events are processed between runs of an
//! auto action. Compared per entity: every answer, the whole history (kinds, states,
//! actions, events, retry counts, reasons, request ids), the final state, retry count,
//! version and request id, that the entity is at rest and unleased, and its permitted
//! events. Nothing depends on timing: the gate is opened by the driver, not by a clock,
//! and the waits and retries declared run on a manual clock that `Engine::drive` moves
//! whenever the engine has caught up.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use settle_core::{Machine, MachineBuilder, StateKind};
use settle_engine::{Engine, EngineBuilder, EventOutcome, ManualClock, Outcome, RaiseOptions, Raised, Wait};
use settle_store::{HistoryKind, HistoryRow, SqliteStore};

const MACHINE: &str = "m";

// ---------------------------------------------------------------------------------------
// The generated machine, as plain data.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stable,
    Unstable,
    Terminal,
    Deleted,
}

#[derive(Debug, Clone)]
struct ActionSpec {
    name: String,
    /// Declared targets (state indices), distinct, in declaration order.
    targets: Vec<usize>,
    /// Whether a handler is bound (always when there is more than one target).
    handler: bool,
    /// For auto handlers: ask for a retry while the entity's retry count is below this.
    retries: u32,
}

#[derive(Debug, Clone)]
struct StateSpec {
    name: String,
    kind: Kind,
    /// A 1 ms `wait` before the auto action (unstable states only).
    wait: bool,
    /// The auto action (unstable states only).
    auto: Option<ActionSpec>,
}

#[derive(Debug, Clone)]
struct EventSpec {
    name: String,
    valid_in: Vec<usize>,
    /// Declared rejection reasons, by state index (never a state where the event is valid).
    reject: BTreeMap<usize, String>,
    action: ActionSpec,
}

#[derive(Debug, Clone)]
struct Spec {
    /// Mixed into the handlers' choice so different cases choose differently.
    salt: u64,
    states: Vec<StateSpec>,
    events: Vec<EventSpec>,
}

/// Raw generated numbers for one state: kind selector, wait, auto-target selectors,
/// handler flag, retry bound.
type RawState = (u8, bool, Vec<u8>, bool, u32);
/// Raw generated numbers for one event: valid-in mask (over the states that are neither
/// terminal nor deleted), reject mask, target selectors, handler flag.
type RawEvent = (u8, u8, Vec<u8>, bool);

fn raw_state() -> impl Strategy<Value = RawState> {
    // Waits are rarer and handlers commoner than even odds: a state without a wait and
    // with a handler is one the driver can interleave an event with.
    (0u8..10, prop::bool::weighted(0.25), vec(any::<u8>(), 1..=3), prop::bool::weighted(0.75), 0u32..=2)
}

fn raw_event() -> impl Strategy<Value = RawEvent> {
    // Valid-in masks are dense (two random masks or-ed) so more events are accepted.
    let valid = (any::<u8>(), any::<u8>()).prop_map(|(a, b)| a | b);
    (valid, any::<u8>(), vec(any::<u8>(), 1..=3), any::<bool>())
}

/// Distinct picks from `candidates`, in the order first picked.
fn pick(candidates: &[usize], selectors: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    for s in selectors {
        let c = candidates[*s as usize % candidates.len()];
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// Interprets raw numbers as a valid machine. State 0 is initial and stable. Auto actions
/// target only states that are not unstable or unstable states declared later, so no
/// chain of unstable states can cycle and every workflow ends.
fn spec_from(raw_states: Vec<RawState>, raw_events: Vec<RawEvent>, salt: u64) -> Spec {
    let mut kinds = Vec::new();
    let mut deleted = false;
    for (i, (k, ..)) in raw_states.iter().enumerate() {
        let kind = match (i, k) {
            (0, _) => Kind::Stable,
            (_, 0..=4) => Kind::Unstable,
            (_, 5..=7) => Kind::Stable,
            (_, 8) => Kind::Terminal,
            (_, _) if !deleted => {
                deleted = true;
                Kind::Deleted
            }
            _ => Kind::Stable,
        };
        kinds.push(kind);
    }
    let n = kinds.len();
    let states = raw_states
        .into_iter()
        .enumerate()
        .map(|(i, (_, wait, selectors, handler, retries))| {
            let name = format!("s{i}");
            let auto = (kinds[i] == Kind::Unstable).then(|| {
                let candidates: Vec<usize> = (0..n).filter(|&j| kinds[j] != Kind::Unstable || j > i).collect();
                let targets = pick(&candidates, &selectors);
                ActionSpec {
                    name: format!("auto_{name}"),
                    handler: handler || targets.len() > 1,
                    retries: if handler || targets.len() > 1 { retries } else { 0 },
                    targets,
                }
            });
            StateSpec { wait: wait && auto.is_some(), name, kind: kinds[i], auto }
        })
        .collect::<Vec<_>>();
    let live: Vec<usize> = (0..n).filter(|&j| matches!(kinds[j], Kind::Stable | Kind::Unstable)).collect();
    let all: Vec<usize> = (0..n).collect();
    let events = raw_events
        .into_iter()
        .enumerate()
        .map(|(i, (valid_mask, reject_mask, selectors, handler))| {
            let name = format!("e{i}");
            let valid_in: Vec<usize> = live
                .iter()
                .copied()
                .enumerate()
                .filter(|(bit, _)| valid_mask & (1 << bit) != 0)
                .map(|(_, s)| s)
                .collect();
            let reject = (0..n)
                .filter(|s| !valid_in.contains(s) && reject_mask & (1 << s) != 0)
                .map(|s| (s, format!("{name} refused in s{s}")))
                .collect();
            let targets = pick(&all, &selectors);
            let action =
                ActionSpec { name: format!("do_{name}"), handler: handler || targets.len() > 1, retries: 0, targets };
            EventSpec { name, valid_in, reject, action }
        })
        .collect();
    Spec { salt, states, events }
}

impl Spec {
    fn state_name(&self, i: usize) -> &str {
        &self.states[i].name
    }

    fn machine(&self) -> Machine {
        let mut b = MachineBuilder::new(MACHINE);
        for (i, s) in self.states.iter().enumerate() {
            b = b.state(&s.name);
            if i == 0 {
                b = b.initial();
            }
            match s.kind {
                Kind::Stable => {}
                Kind::Unstable => {
                    b = b.auto(&s.auto.as_ref().expect("unstable state has an auto action").name);
                    if s.wait {
                        b = b.wait(Duration::from_millis(1));
                    }
                }
                Kind::Terminal => b = b.kind(StateKind::Terminal),
                Kind::Deleted => b = b.kind(StateKind::Deleted),
            }
        }
        for e in &self.events {
            b = b.event(&e.name, e.valid_in.iter().map(|&s| self.state_name(s)), &e.action.name);
            for (s, reason) in &e.reject {
                b = b.reject(self.state_name(*s), reason);
            }
        }
        for a in self.actions() {
            b = b.action(&a.name, a.targets.iter().map(|&s| self.state_name(s)));
        }
        match b.build() {
            Ok(m) => m,
            Err(report) => panic!("generator produced an invalid machine:\n{report}\n{self:#?}"),
        }
    }

    fn actions(&self) -> impl Iterator<Item = &ActionSpec> {
        self.events.iter().map(|e| &e.action).chain(self.states.iter().filter_map(|s| s.auto.as_ref()))
    }
}

// ---------------------------------------------------------------------------------------
// The handlers' deterministic choice (shared by the bound handlers and the model: it is
// the environment, not the semantics under test).

fn choose(salt: u64, state: &str, trigger: &str, retry: u32, n: usize) -> usize {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ salt;
    for b in state.bytes().chain([0xff]).chain(trigger.bytes()).chain([0xff]).chain(retry.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % n as u64) as usize
}

// ---------------------------------------------------------------------------------------
// The reference model.

/// A history row as compared: everything but ids and times.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    from: Option<String>,
    to: Option<String>,
    kind: HistoryKind,
    action: Option<String>,
    event: Option<String>,
    retry: u32,
    detail: Option<String>,
    request_id: Option<String>,
}

impl From<&HistoryRow> for Row {
    fn from(r: &HistoryRow) -> Self {
        Row {
            from: r.from.as_ref().map(ToString::to_string),
            to: r.to.as_ref().map(ToString::to_string),
            kind: r.kind,
            action: r.action.as_ref().map(ToString::to_string),
            event: r.event.as_ref().map(ToString::to_string),
            retry: r.retry,
            detail: r.detail.clone(),
            request_id: r.request_id.clone(),
        }
    }
}

/// The request id the model gives the entity's creation (the runtime generates one; it is
/// mapped to this before comparing).
const CREATE_REQUEST: &str = "<create>";

/// One step of an entity's script, planned with the model.
#[derive(Debug, Clone)]
enum Step {
    /// Raise the event and wait until the entity is at rest.
    Stable { event: String, request: String },
    /// Raise `enter`, which the model says moves the entity into an unstable state (no
    /// wait) whose auto action has a handler; that handler is held at a gate. While it is
    /// held, queue `mid`; then open the gate and wait until the engine is idle. The design
    /// says events are processed between runs of an auto action, so `mid` is processed
    /// right after the held action commits, before any further auto action.
    Interleave { enter: String, enter_request: String, mid: String, mid_request: String },
}

/// The observable answer to one step.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// Accepted; the entity entered `entered` and was then in `state` with `retry`.
    Accepted { entered: String, state: String, retry: u32 },
    /// Rejected in `state`; the entity was then in `rest` with `retry`.
    Rejected { state: String, reason: String, rest: String, retry: u32 },
    /// The entity at rest after an interleaved step.
    AtRest { state: String, retry: u32 },
    /// Anything else (errors, timeouts, failed events).
    Other(String),
}

/// Raw generated numbers for one step: first event, second event, try to interleave.
type RawStep = (u8, u8, bool);

struct ModelEntity<'s> {
    spec: &'s Spec,
    state: usize,
    retry: u32,
    version: i64,
    /// The request that caused the latest state entry (auto actions carry it on).
    request: String,
    history: Vec<Row>,
}

impl<'s> ModelEntity<'s> {
    fn create(spec: &'s Spec) -> Self {
        let mut e =
            ModelEntity { spec, state: 0, retry: 0, version: 1, request: CREATE_REQUEST.to_string(), history: vec![] };
        e.history.push(Row {
            from: None,
            to: Some(spec.state_name(0).to_string()),
            kind: HistoryKind::Create,
            action: None,
            event: None,
            retry: 0,
            detail: None,
            request_id: Some(CREATE_REQUEST.to_string()),
        });
        e.run_autos();
        e
    }

    fn name(&self, s: usize) -> String {
        self.spec.state_name(s).to_string()
    }

    fn kind(&self) -> Kind {
        self.spec.states[self.state].kind
    }

    /// Moves through `action` from the current state to `to` (`None`: re-enter the
    /// current state). Re-entering an unstable state through its own auto action counts a
    /// retry; every other entry starts at 0.
    fn transition(&mut self, action: &ActionSpec, to: Option<usize>, kind: HistoryKind, event: Option<&str>) {
        let from = self.state;
        let to = to.unwrap_or(from);
        let own_auto = self.spec.states[from].auto.as_ref().is_some_and(|a| a.name == action.name);
        let retry = if to == from && self.kind() == Kind::Unstable && own_auto { self.retry + 1 } else { 0 };
        self.history.push(Row {
            from: Some(self.name(from)),
            to: Some(self.name(to)),
            kind,
            action: Some(action.name.clone()),
            event: event.map(str::to_string),
            retry,
            detail: None,
            request_id: Some(self.request.clone()),
        });
        self.state = to;
        self.retry = retry;
        self.version += 1;
    }

    /// The target `action`'s implementation picks in the current state: a handler's
    /// choice, or the one target of a plain transition.
    fn target_of(&self, action: &ActionSpec, trigger: &str) -> usize {
        if action.handler {
            let i = choose(self.spec.salt, self.spec.state_name(self.state), trigger, self.retry, action.targets.len());
            action.targets[i]
        } else {
            action.targets[0]
        }
    }

    /// One run of the current unstable state's auto action.
    fn auto_step(&mut self) {
        let action = self.spec.states[self.state].auto.as_ref().expect("auto_step in an unstable state");
        if action.handler && self.retry < action.retries {
            self.transition(action, None, HistoryKind::Auto, None);
        } else {
            let to = self.target_of(action, "auto");
            self.transition(action, Some(to), HistoryKind::Auto, None);
        }
    }

    /// Runs auto actions until the entity is at rest.
    fn run_autos(&mut self) {
        while self.kind() == Kind::Unstable {
            self.auto_step();
        }
    }

    /// Processes one event (no auto actions): `Ok(entered)` or `Err((state, reason))`.
    fn process(&mut self, event: usize, request: &str) -> Result<String, (String, String)> {
        let ev = &self.spec.events[event];
        if !ev.valid_in.contains(&self.state) {
            let state = self.name(self.state);
            let reason = ev
                .reject
                .get(&self.state)
                .cloned()
                .unwrap_or_else(|| format!("event `{}` is not valid in state `{state}`", ev.name));
            self.history.push(Row {
                from: Some(state.clone()),
                to: None,
                kind: HistoryKind::Rejected,
                action: None,
                event: Some(ev.name.clone()),
                retry: self.retry,
                detail: Some(reason.clone()),
                request_id: Some(request.to_string()),
            });
            return Err((state, reason));
        }
        self.request = request.to_string();
        let to = self.target_of(&ev.action, &ev.name);
        self.transition(&ev.action, Some(to), HistoryKind::Event, Some(&ev.name));
        Ok(self.name(self.state))
    }

    /// Whether raising `event` now enters an unstable state without a wait whose auto
    /// action runs a handler (which the driver can hold at a gate).
    fn gateable(&self, event: usize) -> bool {
        let ev = &self.spec.events[event];
        if !ev.valid_in.contains(&self.state) {
            return false;
        }
        let to = &self.spec.states[self.target_of(&ev.action, &ev.name)];
        to.kind == Kind::Unstable && !to.wait && to.auto.as_ref().is_some_and(|a| a.handler)
    }

    /// Plans one step from raw numbers and predicts its answers.
    fn step(&mut self, (a, b, interleave): RawStep, request: &str) -> (Step, Vec<Answer>) {
        let n = self.spec.events.len();
        let (first, second) = (a as usize % n, b as usize % n);
        let event_name = |i: usize| self.spec.events[i].name.clone();
        if interleave && self.gateable(first) {
            let step = Step::Interleave {
                enter: event_name(first),
                enter_request: format!("{request}a"),
                mid: event_name(second),
                mid_request: format!("{request}b"),
            };
            let entered = self.process(first, &format!("{request}a")).expect("gateable events are accepted");
            let enter = Answer::Accepted { entered: entered.clone(), state: entered, retry: 0 };
            self.auto_step();
            let _ = self.process(second, &format!("{request}b"));
            self.run_autos();
            return (step, vec![enter, Answer::AtRest { state: self.name(self.state), retry: self.retry }]);
        }
        let step = Step::Stable { event: event_name(first), request: request.to_string() };
        let answer = match self.process(first, request) {
            Ok(entered) => {
                self.run_autos();
                Answer::Accepted { entered, state: self.name(self.state), retry: self.retry }
            }
            Err((state, reason)) => Answer::Rejected { state: state.clone(), reason, rest: state, retry: self.retry },
        };
        (step, vec![answer])
    }
}

// ---------------------------------------------------------------------------------------
// Driving the real runtime.

/// Holds an entity's next auto handler run until the driver opens it.
struct Gate {
    armed: AtomicBool,
    open: tokio::sync::Semaphore,
}

impl Gate {
    fn new() -> Self {
        Gate { armed: AtomicBool::new(false), open: tokio::sync::Semaphore::new(0) }
    }
}

type Gates = Arc<HashMap<String, Gate>>;

/// How long anything may take before the test calls it a failure (never reached when
/// the runtime agrees with the model).
const PATIENCE: Duration = Duration::from_secs(30);

fn bind(mut builder: EngineBuilder<SqliteStore>, spec: &Spec, gates: &Gates) -> EngineBuilder<SqliteStore> {
    for a in spec.actions().filter(|a| a.handler) {
        let targets: Vec<String> = a.targets.iter().map(|&s| spec.state_name(s).to_string()).collect();
        let (salt, retries, name, gates) = (spec.salt, a.retries, a.name.clone(), gates.clone());
        builder = builder.on(MACHINE, &a.name, move |ctx| {
            let (targets, name, gates) = (targets.clone(), name.clone(), gates.clone());
            async move {
                if ctx.action != name.as_str() || ctx.machine != MACHINE || !ctx.params.is_null() {
                    return Err(format!("unexpected context {ctx:?}").into());
                }
                if ctx.event.is_none() {
                    let gate = &gates[ctx.key.as_str()];
                    if gate.armed.swap(false, Ordering::SeqCst) {
                        match tokio::time::timeout(PATIENCE, gate.open.acquire()).await {
                            Ok(Ok(permit)) => permit.forget(),
                            _ => return Err("the gate was never opened".into()),
                        }
                    }
                    if ctx.retry < retries {
                        return Ok(Outcome::retry_after(Duration::from_millis(1)));
                    }
                }
                let trigger = ctx.event.as_deref().unwrap_or("auto");
                Ok(Outcome::to(&targets[choose(salt, &ctx.state, trigger, ctx.retry, targets.len())]))
            }
        });
    }
    builder
}

/// What the runtime showed for one entity.
#[derive(Debug)]
struct Observed {
    answers: Vec<Answer>,
    history: Vec<Row>,
    /// The request id the engine generated for the creation.
    create_request: Option<String>,
}

fn options(wait: Wait, request: &str) -> RaiseOptions {
    let mut options = RaiseOptions::wait(wait).timeout(PATIENCE);
    options.request_id = Some(request.to_string());
    options
}

fn answer(raised: settle_engine::Result<Raised>) -> Answer {
    match raised {
        Ok(r) => match (r.outcome, r.entity) {
            (Some(EventOutcome::Accepted { state }), Some(e)) => {
                Answer::Accepted { entered: state.to_string(), state: e.state.to_string(), retry: e.retry }
            }
            (Some(EventOutcome::Rejected { state, reason }), Some(e)) => {
                Answer::Rejected { state: state.to_string(), reason, rest: e.state.to_string(), retry: e.retry }
            }
            other => Answer::Other(format!("{other:?}")),
        },
        Err(e) => Answer::Other(format!("raise error: {e}")),
    }
}

async fn run_plan(engine: Engine<SqliteStore>, gates: Gates, key: String, plan: Vec<Step>) -> Result<Observed, String> {
    engine.create(MACHINE, &key, Default::default()).await.map_err(|e| format!("create: {e}"))?;
    let gate = &gates[key.as_str()];
    let mut answers = Vec::new();
    for step in plan {
        match step {
            Step::Stable { event, request } => {
                answers.push(answer(engine.raise(MACHINE, &key, &event, options(Wait::Stable, &request)).await));
            }
            Step::Interleave { enter, enter_request, mid, mid_request } => {
                gate.armed.store(true, Ordering::SeqCst);
                answers.push(answer(engine.raise(MACHINE, &key, &enter, options(Wait::Outcome, &enter_request)).await));
                let queued = engine.raise(MACHINE, &key, &mid, options(Wait::Queued, &mid_request)).await;
                gate.open.add_permits(1);
                let idle = tokio::time::timeout(PATIENCE, engine.wait_idle()).await;
                gate.armed.store(false, Ordering::SeqCst);
                let e = engine.get(MACHINE, &key).await.map_err(|e| e.to_string())?.ok_or("entity vanished")?;
                answers.push(match (queued, idle) {
                    (Err(e), _) => Answer::Other(format!("queueing `{mid}`: {e}")),
                    (_, Err(_)) => Answer::Other("the engine never became idle".into()),
                    (_, Ok(Err(e))) => Answer::Other(format!("wait_idle: {e}")),
                    _ => Answer::AtRest { state: e.state.to_string(), retry: e.retry },
                });
            }
        }
    }
    let history = engine.history(MACHINE, &key).await.map_err(|e| e.to_string())?;
    // The creation's request id is generated by the engine: name it as the model does.
    let create_request = history.first().and_then(|r| r.request_id.clone());
    let history = history
        .iter()
        .map(Row::from)
        .map(|mut r| {
            if r.request_id.is_some() && r.request_id == create_request {
                r.request_id = Some(CREATE_REQUEST.to_string());
            }
            r
        })
        .collect();
    Ok(Observed { answers, history, create_request })
}

/// Renders rows one per line, for readable failures.
fn show(rows: &[Row]) -> String {
    rows.iter()
        .enumerate()
        .map(|(i, r)| {
            format!(
                "  {i:2}: {:?} {:?} -> {:?} action={:?} event={:?} retry={} detail={:?} request={:?}\n",
                r.kind, r.from, r.to, r.action, r.event, r.retry, r.detail, r.request_id
            )
        })
        .collect()
}

fn run_case(spec: &Spec, scripts: &[Vec<RawStep>]) -> Result<(), TestCaseError> {
    let machine = spec.machine();
    // Plan every entity's steps with the model (the runtime must then agree).
    let mut models = Vec::new();
    let mut plans = Vec::new();
    let mut expected = Vec::new();
    for (k, script) in scripts.iter().enumerate() {
        let mut model = ModelEntity::create(spec);
        let mut plan = Vec::new();
        let mut answers = Vec::new();
        for (i, raw) in script.iter().enumerate() {
            let (step, a) = model.step(*raw, &format!("req-k{k}-{i}"));
            plan.push(step);
            answers.extend(a);
        }
        models.push(model);
        plans.push(plan);
        expected.push(answers);
    }
    let keys: Vec<String> = (0..scripts.len()).map(|k| format!("k{k}")).collect();
    let gates: Gates = Arc::new(keys.iter().map(|k| (k.clone(), Gate::new())).collect());

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (observed, rows, permitted) = rt.block_on(async {
        let store = SqliteStore::open(dir.path().join("model.db")).unwrap();
        let clock = ManualClock::new(1_767_225_600_000);
        let builder = Engine::builder(store).machine(machine).clock(clock.clone());
        let engine = bind(builder, spec, &gates).start().await.unwrap();
        // Entities run concurrently (sharing the engine's batches); each one's steps run
        // in order.
        let mut tasks = tokio::task::JoinSet::new();
        for (k, plan) in plans.into_iter().enumerate() {
            let (engine, gates, key) = (engine.clone(), gates.clone(), keys[k].clone());
            tasks.spawn(async move { (k, run_plan(engine, gates, key, plan).await) });
        }
        let mut observed: Vec<Option<Result<Observed, String>>> = keys.iter().map(|_| None).collect();
        engine
            .drive(&clock, async {
                while let Some(joined) = tasks.join_next().await {
                    let (k, o) = joined.expect("driver task panicked");
                    observed[k] = Some(o);
                }
            })
            .await;
        let idle = tokio::time::timeout(PATIENCE, engine.drive(&clock, engine.wait_idle())).await;
        let mut rows = Vec::new();
        let mut permitted = Vec::new();
        for key in &keys {
            rows.push(engine.get(MACHINE, key).await.unwrap());
            permitted.push(engine.permitted_events(MACHINE, key).await.map_err(|e| e.to_string()));
        }
        engine.shutdown().await;
        assert!(matches!(idle, Ok(Ok(()))), "the engine never became idle: {idle:?}");
        (observed, rows, permitted)
    });

    for (k, model) in models.iter().enumerate() {
        let observed = observed[k]
            .as_ref()
            .expect("every driver reported")
            .as_ref()
            .map_err(|e| TestCaseError::fail(format!("entity k{k}: {e}")))?;
        prop_assert_eq!(&observed.answers, &expected[k], "answers of entity k{}", k);
        prop_assert!(
            observed.history == model.history,
            "history of entity k{}\nruntime:\n{}model:\n{}",
            k,
            show(&observed.history),
            show(&model.history)
        );
        let e = rows[k].as_ref().expect("entity exists");
        prop_assert_eq!(e.state.as_str(), spec.state_name(model.state), "final state of k{}", k);
        prop_assert_eq!(e.retry, model.retry, "final retry of k{}", k);
        prop_assert_eq!(e.version, model.version, "final version of k{}", k);
        let request =
            if e.request_id == observed.create_request { Some(CREATE_REQUEST) } else { e.request_id.as_deref() };
        prop_assert_eq!(request, Some(model.request.as_str()), "request id of k{}", k);
        prop_assert_eq!((e.auto_at, e.due_at, e.lease_owner.as_deref()), (None, None, None), "k{} is at rest", k);
        let valid: Vec<String> =
            spec.events.iter().filter(|ev| ev.valid_in.contains(&model.state)).map(|ev| ev.name.clone()).collect();
        let got: Vec<String> =
            permitted[k].clone().map_err(TestCaseError::fail)?.iter().map(ToString::to_string).collect();
        prop_assert_eq!(got, valid, "permitted events of k{}", k);
    }
    Ok(())
}

fn case() -> impl Strategy<Value = (Spec, Vec<Vec<RawStep>>)> {
    let spec = (vec(raw_state(), 2..=6), vec(raw_event(), 1..=4), any::<u64>())
        .prop_map(|(states, events, salt)| spec_from(states, events, salt));
    (spec, vec(vec((any::<u8>(), any::<u8>(), prop::bool::weighted(0.75)), 0..=8), 1..=3))
}

proptest! {
    // No failure persistence: a failing case is printed, shrunk, and reported in full.
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn runtime_matches_reference_model((spec, scripts) in case()) {
        run_case(&spec, &scripts)?;
    }
}
