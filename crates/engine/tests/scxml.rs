//! Statecharts to the letter (Stateless and SCXML semantics), on SQLite and, when
//! `SETTLE_TEST_PG` is set, on PostgreSQL (a schema per test): a declared re-entry runs
//! exit then entry actions while an unstable state's retry runs neither; a transition's
//! effects apply in SCXML's order — exit actions, the transition's own, entry actions.

mod common;

use serde_json::{Value, json};
use settle_core::Machine;
use settle_engine::{Engine, EngineBuilder, EventOutcome, ManualClock, Outcome, RaiseOptions, Wait};
use settle_store::{AnyStore, EntityRow, HistoryKind};

/// The stores to run on: SQLite, and PostgreSQL (a schema of its own) when available.
use common::stores;

fn load(name: &str, text: &str) -> Machine {
    settle_core::toml::load(&format!("{name}.toml"), name, text).expect("loads").0
}

fn stable(params: Value) -> RaiseOptions {
    RaiseOptions::wait(Wait::Stable).params(params)
}

async fn start(builder: EngineBuilder<AnyStore>) -> (Engine<AnyStore>, ManualClock) {
    let clock = common::clock();
    (builder.clock(clock.clone()).start().await.unwrap(), clock)
}

fn props(v: Value) -> settle_core::Properties {
    v.as_object().cloned().unwrap()
}

fn strings(e: &EntityRow, key: &str) -> Vec<String> {
    e.properties[key].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

/// `desk`: `take` (declared to `busy`) from `busy` is a re-entry; `trying` retries its
/// auto action twice (the handler asks for `trying` again) before `done`. Entry and exit
/// actions log who holds the desk.
const DESK: &str = r#"
initial = "idle"
properties = ["log", "who", "tries"]
[states.idle]
[states.busy]
on_entry = "arrive"
on_exit = "leave"
[states.trying]
auto = "attempt"
on_entry = "arrive"
on_exit = "leave"
[states.done]
[events.take]
in = ["idle", "busy"]
params = ["who"]
action = "take_it"
[events.try]
in = ["busy"]
action = "go_try"
[actions.take_it]
to = ["busy"]
set = { who = "params.who", log = "props.log + ['action ' + params.who]" }
[actions.go_try]
to = ["trying"]
[actions.attempt]
to = ["trying", "done"]
[actions.arrive]
set = { log = "props.log + ['entry ' + props.who]" }
[actions.leave]
set = { log = "props.log + ['exit ' + props.who]" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_re_entry_runs_exit_then_entry_and_a_retry_runs_neither() {
    for (_dir, store) in stores("scxml_reentry").await {
        let builder = Engine::builder(store).machine(load("desk", DESK)).on("desk", "attempt", |ctx| async move {
            let tries = ctx.properties.get("tries").and_then(Value::as_i64).unwrap_or(0);
            let next = if tries < 2 { "trying" } else { "done" };
            Ok(Outcome::to(next).set("tries", json!(tries + 1)))
        });
        let (engine, _clock) = start(builder).await;
        engine.create("desk", "d", props(json!({"log": [], "who": "nobody"}))).await.unwrap();
        let e = engine.raise("desk", "d", "take", stable(json!({"who": "ann"}))).await.unwrap().entity.unwrap();
        assert_eq!(strings(&e, "log"), ["action ann", "entry ann"]);
        let before = e.entered_at;
        let r = engine.raise("desk", "d", "take", stable(json!({"who": "bob"}))).await.unwrap();
        assert_eq!(r.outcome, Some(EventOutcome::Accepted { state: "busy".into() }));
        let e = r.entity.unwrap();
        // The exit action sees the old holder; the action's expressions see what the exit
        // left; the entry action sees the action's.
        assert_eq!(strings(&e, "log")[2..], ["exit ann", "action bob", "entry bob"], "exit, action, entry");
        assert!(e.entered_at >= before && e.version == 3, "a re-entry is a new entry: {e:?}");

        let e = engine.raise("desk", "d", "try", stable(Value::Null)).await.unwrap().entity.unwrap();
        assert_eq!(e.state, "done");
        assert_eq!(e.properties["tries"], json!(3));
        // Into `trying` and out of it once: its two retries ran no exit and no entry action.
        assert_eq!(strings(&e, "log")[5..], ["exit bob", "entry bob", "exit bob"]);
        let retries: Vec<(HistoryKind, u32)> = engine
            .history("desk", "d")
            .await
            .unwrap()
            .iter()
            .filter(|h| h.kind == HistoryKind::Auto)
            .map(|h| (h.kind, h.retry))
            .collect();
        assert_eq!(retries, [(HistoryKind::Auto, 1), (HistoryKind::Auto, 2), (HistoryKind::Auto, 0)]);
        engine.shutdown().await;
    }
}

/// `a` -go→ `b`: the exit action of `a` and the transition's action both write `mark`; the
/// entry action of `b` reads it. `ORDER` is the machine with every action declarative;
/// `ORDER_CODE` binds `move` and `enter_b` to handlers (the runtime runs the hooks as
/// tasks then).
const ORDER: &str = r#"
initial = "a"
properties = ["mark", "order", "seen", "action_saw"]
[states.a]
on_exit = "exit_a"
[states.b]
on_entry = "enter_b"
[events.go]
in = ["a"]
action = "move"
[actions.move]
to = ["b"]
set = { mark = "'action'", order = "props.order + ['action saw ' + props.mark]" }
[actions.exit_a]
set = { mark = "'exit'", order = "props.order + ['exit']" }
[actions.enter_b]
set = { seen = "props.mark", order = "props.order + ['entry saw ' + props.mark]" }
"#;

const ORDER_CODE: &str = r#"
initial = "a"
properties = ["mark", "order", "seen", "action_saw"]
[states.a]
on_exit = "exit_a"
[states.b]
on_entry = "enter_b"
[states.c]
[events.go]
in = ["a"]
action = "move"
[actions.move]
to = ["b", "c"]
[actions.exit_a]
set = { mark = "'exit'", order = "props.order + ['exit']" }
[actions.enter_b]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transitions_effects_apply_exits_then_its_own_then_entries() {
    for (_dir, store) in stores("scxml_order").await {
        let builder = Engine::builder(store)
            .machine(load("order", ORDER))
            .machine(load("order_code", ORDER_CODE))
            // A handler chooses the target, so it runs before the exit actions: it sees the
            // properties before them, and its changes are applied after theirs.
            .on("order_code", "move", |ctx| async move {
                let saw = ctx.properties["mark"].clone();
                Ok(Outcome::to("b").set("mark", json!("action")).set("action_saw", saw))
            })
            .on("order_code", "enter_b", |ctx| async move {
                let mut order = ctx.properties["order"].as_array().cloned().unwrap_or_default();
                let mark = ctx.properties["mark"].as_str().unwrap_or("?").to_string();
                order.push(json!(format!("entry saw {mark}")));
                Ok(Outcome::stay().set("seen", json!(mark)).set("order", json!(order)))
            });
        let (engine, _clock) = start(builder).await;
        for machine in ["order", "order_code"] {
            engine.create(machine, "o", props(json!({"order": [], "mark": "none"}))).await.unwrap();
            let e = engine.raise(machine, "o", "go", stable(Value::Null)).await.unwrap().entity.unwrap();
            assert_eq!(e.state, "b", "{machine}");
            assert_eq!(
                (&e.properties["mark"], &e.properties["seen"]),
                (&json!("action"), &json!("action")),
                "{machine}"
            );
            if machine == "order" {
                assert_eq!(strings(&e, "order"), ["exit", "action saw exit", "entry saw action"]);
            } else {
                assert_eq!(strings(&e, "order"), ["exit", "entry saw action"]);
                assert_eq!(e.properties["action_saw"], json!("none"), "the handler ran before the exit action");
            }
        }
        engine.shutdown().await;
    }
}

/// `in_state('S')` in a guard (SCXML's `In()`): `stop`, valid in all of `online`, is refused
/// while the entity is anywhere inside `maintenance` unless forced.
const SITE: &str = r#"
initial = "online"
[states.online]
initial = "serving"
[states.serving]
parent = "online"
[states.maintenance]
parent = "online"
initial = "draining"
[states.draining]
parent = "maintenance"
[states.stopped]
[events.maintain]
in = ["serving"]
action = "to_maintenance"
[events.stop]
in = ["online"]
params = ["force"]
[[events.stop.when]]
guard = "in_state('maintenance') && !params.force"
reject = "finish maintenance first"
[[events.stop.when]]
action = "halt"
[events.start]
in = ["stopped"]
action = "restart"
[actions.to_maintenance]
to = ["maintenance"]
[actions.halt]
to = ["stopped"]
[actions.restart]
to = ["online"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_asks_in_state_whether_the_entity_is_inside_a_state() {
    for (_dir, store) in stores("scxml_in_state").await {
        let (engine, _clock) = start(Engine::builder(store).machine(load("site", SITE))).await;
        engine.create("site", "s", Default::default()).await.unwrap();
        let free = json!({"force": false});
        let r = engine.raise("site", "s", "stop", stable(free.clone())).await.unwrap();
        assert_eq!(r.outcome, Some(EventOutcome::Accepted { state: "stopped".into() }), "serving: not in maintenance");
        engine.raise("site", "s", "start", stable(Value::Null)).await.unwrap();
        let e = engine.raise("site", "s", "maintain", stable(Value::Null)).await.unwrap().entity.unwrap();
        assert_eq!(e.state, "draining");
        let r = engine.raise("site", "s", "stop", stable(free)).await.unwrap();
        let reason = "finish maintenance first".to_string();
        assert_eq!(r.outcome, Some(EventOutcome::Rejected { state: "draining".into(), reason }), "draining is in it");
        let r = engine.raise("site", "s", "stop", stable(json!({"force": true}))).await.unwrap();
        assert_eq!(r.outcome, Some(EventOutcome::Accepted { state: "stopped".into() }));
        engine.shutdown().await;
    }
}

/// `accept` raises `check` on the order itself (`on = "self"`): an internal event, processed
/// right after `place` commits, before `cancel`, which was queued earlier from outside.
const ORDER_SELF: &str = r#"
initial = "new"
properties = ["trail"]
[states.new]
[states.placed]
[states.checked]
[states.cancelled]
kind = "terminal"
[events.place]
in = ["new"]
action = "accept"
[events.check]
in = ["placed"]
params = ["depth"]
action = "do_check"
[events.cancel]
in = ["placed", "checked"]
action = "do_cancel"
[actions.accept]
to = ["placed"]
set = { trail = "props.trail + ['place']" }
raise = [{ event = "check", on = "self", params = { depth = 2 } }]
[actions.do_check]
to = ["checked"]
set = { trail = "props.trail + ['check ' + string(params.depth)]" }
[actions.do_cancel]
to = ["cancelled"]
set = { trail = "props.trail + ['cancel']" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_raised_on_itself_is_processed_before_any_queued_from_outside() {
    use settle_store::Command;
    for (_dir, store) in stores("scxml_internal").await {
        let (engine, _clock) = start(Engine::builder(store).machine(load("order", ORDER_SELF))).await;
        engine.create("order", "o", props(json!({"trail": []}))).await.unwrap();
        // Both queued while the order is paused: `place`, then `cancel`.
        engine.command("order", "o", Command::Pause, None).await.unwrap();
        let queued = RaiseOptions::default();
        engine.raise("order", "o", "place", queued.clone()).await.unwrap();
        engine.raise("order", "o", "cancel", queued).await.unwrap();
        engine.command("order", "o", Command::Resume, None).await.unwrap();
        engine.wait_idle().await.unwrap();
        let e = engine.get("order", "o").await.unwrap().unwrap();
        assert_eq!(e.state, "cancelled");
        assert_eq!(strings(&e, "trail"), ["place", "check 2", "cancel"], "the internal event went first");
        let rows: Vec<(HistoryKind, Option<String>, Option<String>)> = engine
            .history("order", "o")
            .await
            .unwrap()
            .into_iter()
            .filter(|h| h.event.is_some())
            .map(|h| (h.kind, h.event.map(|e| e.to_string()), h.to.map(|s| s.to_string())))
            .collect();
        let row = |event: &str, to: &str| (HistoryKind::Event, Some(event.to_string()), Some(to.to_string()));
        assert_eq!(rows, [row("place", "placed"), row("check", "checked"), row("cancel", "cancelled")]);
        engine.shutdown().await;
    }
}

/// A player whose `on` has deep history: it resumes the leaf the player was last in there.
/// The memory is the property `$history`, stored with the transition that leaves `on`.
const PLAYER: &str = r#"
initial = "off"
[states.off]
[states.on]
initial = "radio"
history = "deep"
[states.radio]
parent = "on"
[states.cd]
parent = "on"
initial = "stopped"
[states.stopped]
parent = "cd"
[states.playing]
parent = "cd"
[events.power_on]
in = ["off"]
action = "switch_on"
[events.power_off]
in = ["on"]
action = "switch_off"
[events.pick_cd]
in = ["radio"]
action = "to_cd"
[events.play]
in = ["stopped"]
action = "start_playing"
[actions.switch_on]
to = ["on"]
[actions.switch_off]
to = ["off"]
[actions.to_cd]
to = ["cd"]
[actions.start_playing]
to = ["playing"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_with_history_resumes_where_the_entity_last_was() {
    // `on` with deep history resumes `playing`; with shallow history it resumes `cd`, which
    // has none and enters its initial child.
    let shallow = PLAYER.replace(r#"history = "deep""#, r#"history = "shallow""#);
    for (_dir, store) in stores("scxml_history").await {
        let machines = [load("player", PLAYER), load("shallow_player", &shallow)];
        let (engine, _clock) = start(machines.into_iter().fold(Engine::builder(store), |b, m| b.machine(m))).await;
        for (machine, resumed, remembered) in [("player", "playing", "playing"), ("shallow_player", "stopped", "cd")] {
            engine.create(machine, "p", Default::default()).await.unwrap();
            let state = |event: &'static str| {
                let engine = engine.clone();
                async move { engine.raise(machine, "p", event, stable(Value::Null)).await.unwrap().entity.unwrap() }
            };
            assert_eq!(state("power_on").await.state, "radio", "{machine}: the first time, the initial children");
            assert_eq!(state("pick_cd").await.state, "stopped");
            assert_eq!(state("play").await.state, "playing");
            let off = state("power_off").await;
            assert_eq!(off.state, "off");
            assert_eq!(off.properties["$history"], json!({"on": remembered}), "{machine}: stored as `on` was left");
            assert_eq!(state("power_on").await.state, resumed, "{machine}");
            let history = engine.history(machine, "p").await.unwrap();
            let last = history.last().unwrap();
            assert_eq!((last.from.as_deref(), last.to.as_deref()), (Some("off"), Some(resumed)), "{machine}");
        }
        engine.shutdown().await;
    }
}

/// Property names starting with `$` are the engine's: a handler that writes `$history`, as
/// the main action or as an entry action, is a fault of the transition and nothing of it
/// commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_may_not_write_the_engines_properties() {
    let text = r#"
initial = "a"
[states.a]
[states.b]
on_entry = "arrive"
[states.c]
[events.go]
in = ["a"]
action = "move"
[events.sneak]
in = ["a"]
action = "slip"
[actions.move]
to = ["b", "c"]
[actions.slip]
to = ["c", "b"]
[actions.arrive]
"#;
    for (_dir, store) in stores("scxml_engine_property").await {
        let builder = Engine::builder(store)
            .machine(load("guarded", text))
            .on("guarded", "move", |_| async { Ok(Outcome::to("c").set("$history", json!({"x": "y"}))) })
            .on("guarded", "slip", |_| async { Ok(Outcome::to("b")) })
            .on("guarded", "arrive", |_| async { Ok(Outcome::stay().set("$history", json!({}))) });
        let (engine, _clock) = start(builder).await;
        engine.create("guarded", "g", Default::default()).await.unwrap();
        for event in ["go", "sneak"] {
            let r = engine.raise("guarded", "g", event, stable(Value::Null)).await.unwrap();
            let Some(EventOutcome::Failed { error }) = r.outcome else { panic!("{event}: {:?}", r.outcome) };
            assert!(error.contains("`$history`: a property starting with `$` is the engine's"), "{event}: {error}");
            let e = engine.get("guarded", "g").await.unwrap().unwrap();
            assert_eq!(e.state, "a", "{event}: nothing committed");
            assert!(e.properties.get("$history").is_none(), "{event}");
            engine.command("guarded", "g", settle_store::Command::Resume, None).await.ok();
        }
        engine.shutdown().await;
    }
}
