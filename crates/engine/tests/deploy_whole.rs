//! A deploy is whole, on SQLite and (with `SETTLE_TEST_PG`) PostgreSQL: five machines whose
//! fourth version would strand an entity leave all five as they were, whether the versions
//! come with an engine's start or through `Engine::deploy`; a read-only engine writes
//! nothing; an engine on the definitions stored runs them and lends a handler only to a
//! stored version identical to the machine it was registered with.

mod common;

use settle_core::Machine;
use settle_engine::{Config, Engine, Error, Outcome, RaiseOptions, Wait};
use settle_store::{AnyStore, EntityFilter, ManualClock, Store};

use common::{T0, stores};

const NAMES: [&str; 5] = ["m1", "m2", "m3", "m4", "m5"];

/// Machine `name`: `a` -go→ `b`. Version 2 renames `b` to `bb` (its entities move there),
/// except for `strand`, whose version 2 drops `b` altogether (an entity in it has no home).
fn machine(name: &str, v: u32, strand: bool) -> Machine {
    let text = match (v, strand) {
        (1, _) => "initial = \"a\"\n[states.a]\n[states.b]\n[events.go]\nin = [\"a\"]\naction = \"go\"\n\
                   [actions.go]\nto = [\"b\"]\n"
            .to_string(),
        (_, false) => "initial = \"a\"\n[states.a]\n[states.bb]\nrenamed_from = [\"b\"]\n[events.go]\nin = [\"a\"]\n\
                       action = \"go\"\n[actions.go]\nto = [\"bb\"]\n"
            .to_string(),
        (_, true) => "initial = \"a\"\n[states.a]\n[states.c]\n[events.go]\nin = [\"a\"]\naction = \"go\"\n\
                      [actions.go]\nto = [\"c\"]\n"
            .to_string(),
    };
    settle_core::toml::load(&format!("{name}.toml"), name, &text).unwrap().0
}

/// All five at version `v`; the fourth stranding when `strand_fourth`.
fn five(v: u32, strand_fourth: bool) -> Vec<Machine> {
    NAMES.iter().map(|n| machine(n, v, strand_fourth && *n == "m4")).collect()
}

fn builder(store: &AnyStore, clock: &ManualClock, machines: Vec<Machine>) -> settle_engine::EngineBuilder<AnyStore> {
    machines.into_iter().fold(Engine::builder(store.clone()).clock(clock.clone()), |b, m| b.machine(m))
}

/// Every stored version and every entity's (machine, key, state, version, definition hash):
/// what a refused or read-only start must leave byte for byte.
async fn snapshot(store: &AnyStore) -> (Vec<(String, String, String, i64, String)>, Vec<String>) {
    let versions = store
        .machine_list()
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.name.to_string(), r.hash, r.definition, r.created_at, r.origin))
        .collect();
    let entities = store
        .entity_list(EntityFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|e| format!("{}/{} {} v{} {:?}", e.machine, e.key, e.state, e.version, e.machine_hash))
        .collect();
    (versions, entities)
}

/// A store holding version 1 of the five machines, with one entity of each in `b`.
async fn seeded(store: &AnyStore, clock: &ManualClock) {
    let e = builder(store, clock, five(1, false)).start().await.unwrap();
    for name in NAMES {
        e.create(name, "k", Default::default()).await.unwrap();
        e.raise(name, "k", "go", RaiseOptions::wait(Wait::Outcome)).await.unwrap();
    }
    e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_starting_with_five_versions_whose_fourth_is_refused_changes_nothing() {
    for (_dir, store) in stores("whole_start").await {
        let clock = ManualClock::new(T0);
        seeded(&store, &clock).await;
        let before = snapshot(&store).await;
        clock.advance(std::time::Duration::from_secs(1));
        let err = builder(&store, &clock, five(2, true)).start().await.err().expect("refused");
        let Error::UpgradeRefused { stranded, .. } = &err else { panic!("{err}") };
        assert_eq!((stranded[0].machine.as_str(), stranded[0].state.as_str()), ("m4", "b"), "{err}");
        assert_eq!(snapshot(&store).await, before, "a refused start stores no version and moves no entity");
        // Without the stranding version, all five are deployed and every entity moves.
        let e = builder(&store, &clock, five(2, false)).start().await.unwrap();
        for name in NAMES {
            let k = e.get(name, "k").await.unwrap().unwrap();
            assert_eq!(k.state.as_str(), "bb", "{name}");
            assert_eq!(k.machine_hash.as_deref(), Some(machine(name, 2, false).content_hash().as_str()));
        }
        assert_eq!(e.store().machine_list().await.unwrap().len(), 10);
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_of_five_versions_whose_fourth_is_refused_changes_nothing() {
    for (_dir, store) in stores("whole_deploy").await {
        let clock = ManualClock::new(T0);
        seeded(&store, &clock).await;
        let e = builder(&store, &clock, five(1, false)).start().await.unwrap();
        let before = snapshot(&store).await;
        let err = e.deploy(five(2, true), false).await.unwrap_err();
        assert!(matches!(err, Error::UpgradeRefused { .. }), "{err}");
        assert_eq!(snapshot(&store).await, before);
        for name in NAMES {
            assert_eq!(e.machine(name).unwrap().content_hash(), machine(name, 1, false).content_hash());
        }
        let done = e.deploy(five(2, false), false).await.unwrap();
        assert_eq!(done.iter().map(|d| d.moved).collect::<Vec<_>>(), [1; 5]);
        for name in NAMES {
            assert_eq!(e.get(name, "k").await.unwrap().unwrap().state.as_str(), "bb");
        }
        e.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_engine_writes_nothing_and_refuses_every_write() {
    for (_dir, store) in stores("read_only").await {
        let clock = ManualClock::new(T0);
        seeded(&store, &clock).await;
        let before = snapshot(&store).await;
        let config = Config { read_only: true, ..Config::default() };
        // Given newer versions, it runs them in memory and stores none of them.
        let e = builder(&store, &clock, five(2, false)).config(config).clock(clock.clone()).start().await.unwrap();
        assert_eq!(e.machine("m1").unwrap().content_hash(), machine("m1", 2, false).content_hash());
        let refused = |r: Result<(), Error>, what: &str| match r {
            Err(Error::ReadOnly(_)) => {}
            other => panic!("{what}: {other:?}"),
        };
        refused(e.create("m1", "new", Default::default()).await.map(|_| ()), "create");
        refused(e.raise("m1", "k", "go", RaiseOptions::default()).await.map(|_| ()), "raise");
        refused(e.command("m1", "k", settle_store::Command::Pause, None).await.map(|_| ()), "pause");
        refused(e.deploy(five(1, false), false).await.map(|_| ()), "deploy");
        // Dry runs answer.
        assert_eq!(e.deploy(five(1, false), true).await.unwrap().len(), 5);
        e.prune(None, true, |_| {}).await.unwrap();
        clock.advance(std::time::Duration::from_secs(3600));
        e.shutdown().await;
        assert_eq!(snapshot(&store).await, before);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_on_the_stored_definitions_lends_handlers_only_to_identical_versions() {
    // `h`: a -go→ `pick`, whose two targets need a handler; `h` prime has one state more.
    let h = |extra: bool| {
        let more = if extra { "[states.d]\n" } else { "" };
        let text = format!(
            "initial = \"a\"\n[states.a]\n[states.b]\n[states.c]\n{more}[events.go]\nin = [\"a\"]\naction = \"pick\"\n\
             [actions.pick]\nto = [\"b\", \"c\"]\n"
        );
        settle_core::toml::load("h.toml", "h", &text).unwrap().0
    };
    let picking = |b: settle_engine::EngineBuilder<AnyStore>| b.on("h", "pick", |_| async { Ok(Outcome::to("c")) });
    for (_dir, store) in stores("stored_defs").await {
        let clock = ManualClock::new(T0);
        let e = picking(builder(&store, &clock, vec![h(false)])).start().await.unwrap();
        e.create("h", "k1", Default::default()).await.unwrap();
        e.shutdown().await;
        let before = snapshot(&store).await;
        // Registered identical: the stored version runs with the handler.
        let e = picking(builder(&store, &clock, vec![h(false)]).stored_definitions()).start().await.unwrap();
        let raised = e.raise("h", "k1", "go", RaiseOptions::wait(Wait::Stable)).await.unwrap();
        assert_eq!(raised.entity.unwrap().state.as_str(), "c");
        e.shutdown().await;
        // Registered different: the stored version runs, and needs a handler it has not.
        let err = picking(builder(&store, &clock, vec![h(true)]).stored_definitions()).start().await.err();
        assert!(matches!(err, Some(Error::MissingHandlers(_))), "{err:?}");
        // An engine that processes nothing needs none; it registers nothing of its own.
        let config = Config { max_inflight: 0, ..Config::default() };
        let e = builder(&store, &clock, vec![h(true)]).stored_definitions().config(config).start().await.unwrap();
        assert_eq!(e.machine("h").unwrap().content_hash(), h(false).content_hash());
        assert!(e.machine("m1").is_err());
        e.shutdown().await;
        assert_eq!(snapshot(&store).await.0, before.0, "no version stored");
    }
}
