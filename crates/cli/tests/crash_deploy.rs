//! A deploy killed with `kill -9` leaves all of it or none of it: five machines whose new
//! versions each rename the state thousands of entities are in, deployed by `settle deploy`
//! processes killed at spread-out moments, each on a fresh copy of the same database; after
//! every kill the database holds either the five old versions with every entity where it
//! was, or the five new ones with every entity moved (and its history saying so).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use settle_engine::Engine;
use settle_store::{AnyStore, EntityFilter, SqliteStore, Store};

const MACHINES: usize = 5;
const ENTITIES: usize = 4_000;
const ROUNDS: usize = 12;

/// Machine `m{i}` at version `v`: its initial state is `a` (version 1) or `aa` (version 2,
/// renamed from `a`: every entity in `a` moves there with a history row).
fn definition(v: u32) -> String {
    let initial = if v == 1 { "a" } else { "aa" };
    let renamed = if v == 1 { "" } else { "renamed_from = [\"a\"]\n" };
    format!(
        "initial = \"{initial}\"\n[states.{initial}]\n{renamed}[states.b]\n[events.go]\nin = [\"{initial}\"]\n\
         action = \"go\"\n[actions.go]\nto = [\"b\"]\n"
    )
}

fn write(dir: &Path, v: u32) -> Vec<String> {
    let out = dir.join(format!("v{v}"));
    std::fs::create_dir_all(&out).unwrap();
    (1..=MACHINES)
        .map(|i| {
            let path = out.join(format!("m{i}.toml"));
            std::fs::write(&path, definition(v)).unwrap();
            path.display().to_string()
        })
        .collect()
}

/// Version 1 of the five machines with `ENTITIES` entities each in `a`.
async fn seed(db: &Path) {
    let store = AnyStore::Sqlite(SqliteStore::open(db).unwrap());
    let mut b = Engine::builder(store);
    for i in 1..=MACHINES {
        let m = settle_core::toml::load("m.toml", &format!("m{i}"), &definition(1)).unwrap().0;
        b = b.machine(m);
    }
    let engine = b.start().await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 1..=MACHINES {
        for k in 0..ENTITIES {
            let e = engine.clone();
            tasks.spawn(async move { e.create(&format!("m{i}"), &format!("k{k}"), Default::default()).await });
            while tasks.len() >= 512 {
                tasks.join_next().await.unwrap().unwrap().unwrap();
            }
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    engine.shutdown().await;
}

/// Copies the database file (and its log, if any) to `to`.
fn copy(from: &Path, to: &Path) {
    for suffix in ["", "-wal"] {
        let f = format!("{}{suffix}", from.display());
        if Path::new(&f).exists() {
            std::fs::copy(&f, format!("{}{suffix}", to.display())).unwrap();
        }
    }
}

/// `settle --db DB deploy FILES`, killed with SIGKILL after `after` (`None`: run to the
/// end); whether it finished first.
fn deploy(db: &Path, files: &[String], after: Option<Duration>) -> bool {
    let mut child = Command::new(env!("CARGO_BIN_EXE_settle"))
        .arg("--db")
        .arg(db)
        .arg("deploy")
        .args(files)
        .env("SETTLE_LOG", "error")
        .env_remove("SETTLE_SERVER")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let Some(after) = after else {
        assert!(child.wait().unwrap().success());
        return true;
    };
    std::thread::sleep(after);
    let finished = child.try_wait().unwrap().is_some();
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    finished
}

/// Which version the database is at, checked whole: 1 or 2.
async fn at(db: &Path) -> u32 {
    let store = SqliteStore::open_read_only(db).unwrap();
    let records = store.machine_list().await.unwrap();
    let current: Vec<String> = (1..=MACHINES)
        .map(|i| {
            let name = format!("m{i}");
            let hash = |v: u32| settle_core::toml::load("m.toml", &name, &definition(v)).unwrap().0.content_hash();
            let newest = records.iter().filter(|r| r.name == name.as_str()).max_by_key(|r| r.created_at).unwrap();
            if newest.hash == hash(1) {
                "1".to_string()
            } else {
                assert_eq!(newest.hash, hash(2), "{name}");
                "2".to_string()
            }
        })
        .collect();
    assert!(current.iter().all(|v| *v == current[0]), "half a deploy is visible: versions {current:?}");
    let v: u32 = current[0].parse().unwrap();
    let entities = store.entity_list(EntityFilter::default()).await.unwrap();
    assert_eq!(entities.len(), MACHINES * ENTITIES);
    let state = if v == 1 { "a" } else { "aa" };
    let wrong: Vec<_> = entities.iter().filter(|e| e.state != state).take(3).collect();
    assert!(wrong.is_empty(), "version {v} current, but entities elsewhere: {wrong:?}");
    if v == 2 {
        let one = &entities[entities.len() / 2];
        let history = store.history_list(one.id).await.unwrap();
        assert!(history.iter().any(|h| h.to.as_deref() == Some("aa")), "the move is in its history: {history:?}");
    }
    v
}

#[test]
fn a_deploy_killed_in_the_middle_leaves_all_of_it_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let seeded = dir.path().join("seeded.db");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(seed(&seeded));
    let v2 = write(dir.path(), 2);
    // How long a deploy takes here, run to its end.
    let whole = dir.path().join("whole.db");
    copy(&seeded, &whole);
    let started = Instant::now();
    deploy(&whole, &v2, None);
    let took = started.elapsed();
    assert_eq!(rt.block_on(at(&whole)), 2);
    eprintln!("a whole deploy takes {took:?}");
    let mut seen = [0usize; 3];
    for round in 0..ROUNDS {
        let db = dir.path().join(format!("round{round}.db"));
        copy(&seeded, &db);
        // Spread over the second half of the run, where the plan is made and written.
        let after = took.mul_f64(0.45 + 0.6 * round as f64 / ROUNDS as f64);
        let finished = deploy(&db, &v2, Some(after));
        let v = rt.block_on(at(&db));
        eprintln!("round {round}: killed after {after:?} (finished: {finished}): version {v}");
        seen[v as usize] += 1;
        // The database goes on: a deploy run again completes it.
        deploy(&db, &v2, None);
        assert_eq!(rt.block_on(at(&db)), 2);
    }
    assert!(seen[1] > 0, "no kill fell before the deploy's commit: {seen:?}");
}
