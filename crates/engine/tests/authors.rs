//! One outcome, three authors (DESIGN §1): a Rust handler, a declarative TOML action and an
//! agent's report give the same whole outcome — a target, a property computed from the
//! entity and from the parameters of the event whose workflow the auto action runs in, a
//! property removed, a successor created with a first event, an event raised on an entity
//! named by key with a reply (a sync nested event) — and the engine commits it alike, on
//! SQLite and on PostgreSQL (`SETTLE_TEST_PG`). A handler and an agent (a declarative action
//! has a fixed outcome: it can neither retry nor join) also retry with a delay, join an
//! entity into the workflow and raise on every successor alike.

mod common;

use std::time::Duration;

use serde_json::json;
use settle_core::step::{Create, PropChange, Raise};
use settle_core::{ActionOutcome, Machine, Properties, StateName};
use settle_engine::{Engine, RaiseOptions, Wait};
use settle_store::{PgStore, Store, TaskResult};

#[derive(Clone, Copy, Debug)]
enum Author {
    Rust,
    Toml,
    Agent,
}

/// `parent`: idle -go {n}→ working, whose auto action `work` (each author's) moves to
/// `waiting` with `size` twice `base` plus go's `n`, `base` removed, creates `<key>-c` and
/// starts it, and pokes `peer` `p1` asking for the reply `peer_done`, which records what
/// came of the poke and moves on to `done`.
fn parent(author: Author) -> Machine {
    let work = match author {
        Author::Rust => "",
        Author::Toml => {
            "set = { size = \"props.base * 2 + params.n\" }\nunset = [\"base\"]\n\
             create = [{ machine = \"child\", key = \"key + '-c'\", event = \"start\" }]\n\
             raise = [{ event = \"poke\", machine = \"peer\", key = \"'p1'\", reply = \"peer_done\" }]\n"
        }
        Author::Agent => "agent = \"q\"\nlock = \"30s\"\n",
    };
    let text = format!(
        "name = \"parent\"\ninitial = \"idle\"\nproperties = [\"base\"]\n\
         [states.idle]\n[states.working]\nauto = \"work\"\n[states.waiting]\n[states.done]\n\
         [events.go]\nin = [\"idle\"]\naction = \"begin\"\nparams = [\"n\"]\n\
         [events.peer_done]\nin = [\"waiting\"]\naction = \"finish\"\nparams = [\"outcome\", \"state\"]\n\
         [actions.finish]\nto = [\"done\"]\nset = {{ peer = \"params.outcome + ' ' + params.state\" }}\n\
         [actions.begin]\nto = [\"working\"]\n\
         [actions.work]\nto = [\"waiting\"]\nmay_create = [\"child\"]\nmay_raise = [\"start\", \"poke\"]\n{work}"
    );
    settle_core::toml::load("parent.toml", "parent", &text).expect("parent loads").0
}

fn small(name: &str, from: &str, event: &str, to: &str) -> Machine {
    let text = format!(
        "name = \"{name}\"\ninitial = \"{from}\"\n[states.{from}]\n[states.{to}]\n\
         [events.{event}]\nin = [\"{from}\"]\naction = \"do_{event}\"\n[actions.do_{event}]\nto = [\"{to}\"]\n"
    );
    settle_core::toml::load(&format!("{name}.toml"), name, &text).expect("loads").0
}

/// The whole outcome, as each author states it.
fn outcome(key: &str, base: i64, n: i64) -> ActionOutcome {
    ActionOutcome {
        target: Some(StateName::new("waiting")),
        changes: vec![PropChange::Set("size".into(), json!(base * 2 + n)), PropChange::Remove("base".into())],
        creates: vec![Create {
            machine: "child".into(),
            key: format!("{key}-c").into(),
            properties: Properties::new(),
        }],
        raises: vec![
            Raise {
                machine: "child".into(),
                key: format!("{key}-c").into(),
                event: "start".into(),
                params: json!({}),
                join: false,
                reply: None,
            },
            Raise {
                machine: "peer".into(),
                key: "p1".into(),
                event: "poke".into(),
                params: json!({}),
                join: false,
                reply: Some("peer_done".into()),
            },
        ],
        ..ActionOutcome::default()
    }
}

/// What the outcome left: the parent's state and size, its successors and their states,
/// the peer's state.
async fn run<S: Store + Clone>(store: S, author: Author) -> (String, Properties, Vec<(String, String)>, String) {
    let mut builder = Engine::builder(store)
        .machine(parent(author))
        .machine(small("child", "new", "start", "started"))
        .machine(small("peer", "idle", "poke", "poked"))
        .clock(common::clock());
    if let Author::Rust = author {
        builder = builder.on("parent", "work", |ctx| async move {
            assert_eq!((ctx.event.as_deref(), ctx.trigger.as_deref()), (None, Some("go")), "an auto action");
            let base = ctx.properties["base"].as_i64().unwrap_or_default();
            let n = ctx.params["n"].as_i64().unwrap_or_default();
            let child = format!("{}-c", ctx.key);
            Ok(settle_engine::Outcome::to("waiting")
                .set("size", json!(base * 2 + n))
                .remove("base")
                .create("child", &child, Properties::new())
                .raise("child", &child, "start", json!({}))
                .raise_with_reply("peer", "p1", "poke", json!({}), "peer_done"))
        });
    }
    let engine = builder.start().await.unwrap();
    engine.create("peer", "p1", Properties::new()).await.unwrap();
    let mut props = Properties::new();
    props.insert("base".into(), json!(21));
    engine.create("parent", "a", props).await.unwrap();
    engine.raise("parent", "a", "go", RaiseOptions::wait(Wait::Outcome).params(json!({"n": 5}))).await.unwrap();
    if let Author::Agent = author {
        let tasks = engine.agent_lease("q", "agent-1", 1, Duration::from_secs(10)).await.unwrap();
        let task = &tasks[0];
        assert_eq!(task.event.as_deref(), Some("go"));
        let (base, n) = (task.properties["base"].as_i64().unwrap(), task.params["n"].as_i64().unwrap());
        let report = TaskResult::Complete(outcome("a", base, n));
        engine.agent_report(task.id, task.token.as_deref().unwrap(), report).await.unwrap();
    }
    engine.wait_idle().await.unwrap();
    let p = engine.get("parent", "a").await.unwrap().unwrap();
    let succ = engine.store().successor_snapshot(p.id).await.unwrap().successors;
    let succ = succ.iter().map(|e| (e.key.to_string(), e.state.to_string())).collect();
    let peer = engine.get("peer", "p1").await.unwrap().unwrap().state.to_string();
    engine.shutdown().await;
    (p.state.to_string(), p.properties, succ, peer)
}

fn expected() -> (String, Properties, Vec<(String, String)>, String) {
    let props = json!({"size": 47, "peer": "accepted poked"}).as_object().unwrap().clone();
    ("done".into(), props, vec![("a-c".into(), "started".into())], "poked".into())
}

#[tokio::test]
async fn every_author_commits_the_same_outcome_on_sqlite() {
    for author in [Author::Rust, Author::Toml, Author::Agent] {
        let (_dir, store) = common::sqlite();
        assert_eq!(run(store, author).await, expected(), "{author:?}");
    }
}

#[tokio::test]
async fn every_author_commits_the_same_outcome_on_postgres() {
    for author in [Author::Rust, Author::Toml, Author::Agent] {
        let Some(url) = settle_store::postgres::test_url("authors") else { return };
        let store = tokio::task::spawn_blocking(move || PgStore::open(&url)).await.unwrap().expect("open PostgreSQL");
        assert_eq!(run(store, author).await, expected(), "{author:?}");
    }
}

/// `hub`: idle -go→ working, whose auto action `work` (a Rust handler's or an agent's; a
/// declarative action can neither retry nor join) first asks to run again in 5 s, then
/// moves to `waiting`, joins `peer2` `p2` with `poke` (it becomes a successor) and raises
/// `note` on every successor — `p2` among them, joined in the same commit.
fn hub(author: Author) -> Machine {
    let work = if let Author::Agent = author { "agent = \"q\"\nlock = \"30s\"\n" } else { "" };
    let text = format!(
        "name = \"hub\"\ninitial = \"idle\"\n[states.idle]\n[states.working]\nauto = \"work\"\n[states.waiting]\n\
         [events.go]\nin = [\"idle\"]\naction = \"begin\"\n[actions.begin]\nto = [\"working\"]\n\
         [actions.work]\nto = [\"waiting\", \"working\"]\nmay_raise = [\"poke\", \"note\"]\n{work}"
    );
    settle_core::toml::load("hub.toml", "hub", &text).expect("hub loads").0
}

fn peer2() -> Machine {
    let text = "name = \"peer2\"\ninitial = \"idle\"\n[states.idle]\n[states.poked]\n\
                [events.poke]\nin = [\"idle\"]\naction = \"do_poke\"\n\
                [events.note]\nin = [\"poked\"]\naction = \"do_note\"\ninternal = true\nparams = [\"by\"]\n\
                [actions.do_poke]\nto = [\"poked\"]\n[actions.do_note]\nset = { noted = \"params.by\" }\n";
    settle_core::toml::load("peer2.toml", "peer2", text).expect("peer2 loads").0
}

/// The second step's outcome, as an agent states it.
fn joined() -> ActionOutcome {
    ActionOutcome {
        target: Some(StateName::new("waiting")),
        raises: vec![Raise {
            machine: "peer2".into(),
            key: "p2".into(),
            event: "poke".into(),
            params: json!({}),
            join: true,
            reply: None,
        }],
        related: vec![settle_core::Broadcast {
            event: "note".into(),
            on: settle_core::Related::Successors,
            params: json!({"by": "hub"}),
        }],
        ..ActionOutcome::default()
    }
}

/// What it left: the hub's state and how many times its state was entered for a retry,
/// its successors, the peer's state and `noted`.
async fn run_joined<S: Store + Clone>(
    store: S,
    author: Author,
) -> (String, u32, Vec<String>, String, serde_json::Value) {
    let clock = common::clock();
    let mut builder = Engine::builder(store).machine(hub(author)).machine(peer2()).clock(clock.clone());
    if let Author::Rust = author {
        builder = builder.on("hub", "work", |ctx| async move {
            if ctx.retry == 0 {
                return Ok(settle_engine::Outcome::retry_after(Duration::from_secs(5)));
            }
            Ok(settle_engine::Outcome::to("waiting").join("peer2", "p2", "poke", json!({})).raise_on(
                settle_core::Related::Successors,
                "note",
                json!({"by": "hub"}),
            ))
        });
    }
    let engine = builder.start().await.unwrap();
    engine.create("peer2", "p2", Properties::new()).await.unwrap();
    engine.create("hub", "h", Properties::new()).await.unwrap();
    engine.raise("hub", "h", "go", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
    if let Author::Agent = author {
        let task = engine.agent_lease("q", "agent-1", 1, Duration::from_secs(10)).await.unwrap().remove(0);
        let retry = ActionOutcome { delay: Some(Duration::from_secs(5)), ..ActionOutcome::default() };
        engine.agent_report(task.id, task.token.as_deref().unwrap(), TaskResult::Complete(retry)).await.unwrap();
    }
    engine.wait_caught_up().await.unwrap();
    let h = engine.get("hub", "h").await.unwrap().unwrap();
    assert_eq!((h.state.as_str(), h.retry), ("working", 1), "{author:?}: waiting out the delay");
    clock.advance(Duration::from_secs(5));
    if let Author::Agent = author {
        let task = engine.agent_lease("q", "agent-1", 1, Duration::from_secs(10)).await.unwrap().remove(0);
        engine.agent_report(task.id, task.token.as_deref().unwrap(), TaskResult::Complete(joined())).await.unwrap();
    }
    engine.drive(&clock, engine.wait_idle()).await.unwrap();
    let h = engine.get("hub", "h").await.unwrap().unwrap();
    let succ = engine.store().successor_snapshot(h.id).await.unwrap().successors;
    let succ = succ.iter().map(|e| e.key.to_string()).collect();
    let p2 = engine.get("peer2", "p2").await.unwrap().unwrap();
    engine.shutdown().await;
    (h.state.to_string(), h.retry, succ, p2.state.to_string(), p2.properties.get("noted").cloned().unwrap_or_default())
}

fn expected_joined() -> (String, u32, Vec<String>, String, serde_json::Value) {
    ("waiting".into(), 0, vec!["p2".into()], "poked".into(), json!("hub"))
}

#[tokio::test]
async fn a_retry_with_a_delay_a_join_and_a_raise_on_successors_commit_alike_on_sqlite() {
    for author in [Author::Rust, Author::Agent] {
        let (_dir, store) = common::sqlite();
        assert_eq!(run_joined(store, author).await, expected_joined(), "{author:?}");
    }
}

#[tokio::test]
async fn a_retry_with_a_delay_a_join_and_a_raise_on_successors_commit_alike_on_postgres() {
    for author in [Author::Rust, Author::Agent] {
        let Some(url) = settle_store::postgres::test_url("authors_joined") else { return };
        let store = tokio::task::spawn_blocking(move || PgStore::open(&url)).await.unwrap().expect("open PostgreSQL");
        assert_eq!(run_joined(store, author).await, expected_joined(), "{author:?}");
    }
}
