//! Every `settle bench` workload, run small as a correctness check (a benchmark nobody runs
//! breaks silently): fan-out, timers, the soak (with pruning) and a sweep of `chain` over concurrencies and its open loop (`--rate`) on SQLite, chain and fan-out on PostgreSQL in this
//! process and with worker processes (`--instances`); `bench fleet` on both. `bench chain` and `bench agents` on
//! SQLite are in `cli.rs`; `bench dormant` and `bench bulk` on both. The PostgreSQL runs need `SETTLE_TEST_PG`; without it they say
//! they skipped.

mod common;

use std::path::Path;
use std::process::Command;

use common::{settle, stderr, stdout};
use serde_json::Value;

/// Runs `settle --db DB bench ARGS... --json`: its one JSON line.
fn bench(db: &str, args: &[&str]) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_settle"))
        .args(["--db", db, "bench"])
        .args(args)
        .arg("--json")
        .env("SETTLE_LOG", "error")
        .output()
        .expect("run settle bench");
    assert!(o.status.success(), "settle bench {args:?} failed:\n{}", stderr(&o));
    serde_json::from_str(stdout(&o).trim()).unwrap_or_else(|e| panic!("not one JSON line ({e}): {}", stdout(&o)))
}

fn check_fanout(v: &Value, parents: u64, children: u64) {
    assert_eq!(v["workflows"], parents, "{v}");
    assert_eq!(v["transitions"], parents * (3 + children), "{v}");
    assert!(v["p99_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{v}");
}

#[test]
fn fanout_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fan.db");
    let v = bench(db.to_str().unwrap(), &["fanout", "--entities", "60", "--children", "3", "--concurrency", "16"]);
    check_fanout(&v, 60, 3);
    // Every parent and child finished, and the database says so.
    let o = settle(Path::new(&db), &["list", "--machine", "fanchild", "--json"]);
    let children: Vec<Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(children.len(), 180);
    assert!(children.iter().all(|c| c["state"] == "done"));
}

#[test]
fn timers_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("timers.db");
    let v = bench(db.to_str().unwrap(), &["timers", "--entities", "300", "--after", "2s"]);
    assert_eq!(v["timers"], 300, "{v}");
    assert!(v["all_fired_after_restart_s"].as_f64().is_some_and(|s| s > 0.0), "{v}");
}

#[test]
fn chain_and_fanout_on_postgres() {
    for instances in ["0", "1"] {
        let Some(url) = settle_store::postgres::test_url("bench") else { return };
        let v = bench(
            &url,
            &["chain", "--entities", "80", "--steps", "3", "--concurrency", "16", "--instances", instances],
        );
        assert_eq!((v["workflows"].as_u64(), v["transitions"].as_u64()), (Some(80), Some(320)), "{v}");
        assert_eq!(v["instances"], instances.parse::<u64>().unwrap());
        let Some(url) = settle_store::postgres::test_url("benchfan") else { return };
        let v = bench(
            &url,
            &["fanout", "--entities", "30", "--children", "4", "--concurrency", "8", "--instances", instances],
        );
        check_fanout(&v, 30, 4);
    }
}

/// `bench fleet`, small: the fleet is written and every read it times answers; the pages
/// the CLI reads through the same filters hold exactly the entities the seed put there.
fn check_fleet(db: &str) {
    let v = bench(db, &["fleet", "--entities", "2000", "--repeat", "3"]);
    assert_eq!(v["entities"], 2000, "{v}");
    for read in [
        "overview",
        "list_machine",
        "list_rare_state",
        "list_parent_state",
        "list_parked",
        "list_key_prefix",
        "list_entered",
        "list_rare_state_newest",
    ] {
        assert!(v[format!("{read}_ms")].as_f64().is_some_and(|ms| ms >= 0.0), "{read}: {v}");
    }
    let keys = |args: &[&str]| -> Vec<String> {
        let o = settle(Path::new(db), &[&["list", "--json"], args].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["key"].as_str().unwrap().to_string())
            .collect()
    };
    // Keys srv-0000010 … srv-0000019, in key order.
    assert_eq!(keys(&["--prefix", "srv-000001"]), (10..20).map(|n| format!("srv-{n:07}")).collect::<Vec<_>>());
    // Every hundredth entity in `running` (n % 1000 < 900) was paused: 0, 100, …, 800, 1000, …, 1800.
    let paused: Vec<String> =
        (0..2000).filter(|n| n % 100 == 0 && n % 1000 < 900).map(|n| format!("srv-{n:07}")).collect();
    assert_eq!(keys(&["--status", "paused"]), paused);
    // A rare state: n % 1000 >= 994.
    let broken: Vec<String> = (0..2000).filter(|n| n % 1000 >= 994).map(|n| format!("srv-{n:07}")).collect();
    assert_eq!(keys(&["--machine", "fleet", "--state", "broken"]), broken);
}

#[test]
fn fleet_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    check_fleet(dir.path().join("fleet.db").to_str().unwrap());
}

#[test]
fn fleet_on_postgres() {
    let Some(url) = settle_store::postgres::test_url("bench_fleet") else { return };
    check_fleet(&url);
}

/// `bench dormant`, small: the fleet is written, a batch of due work is timed at each
/// step, and after the restart every timer fires and its lateness is reported.
fn check_dormant(db: &str) {
    let v = bench(
        db,
        &[
            "dormant",
            "--entities",
            "2000",
            "--timers",
            "200",
            "--steps",
            "500,2000",
            "--due",
            "20",
            "--rounds",
            "3",
            "--lead",
            "3s",
            "--spread",
            "2s",
        ],
    );
    assert_eq!((v["entities"].as_u64(), v["timers"].as_u64()), (Some(2000), Some(200)), "{v}");
    let claims = v["claim"].as_array().unwrap_or_else(|| panic!("no claim steps: {v}"));
    assert_eq!(claims.iter().map(|c| c["entities"].as_u64().unwrap()).collect::<Vec<_>>(), [500, 2000], "{v}");
    assert!(claims.iter().all(|c| c["ms"].as_f64().is_some_and(|ms| ms > 0.0)), "{v}");
    for c in claims {
        // The step's figure is the median of its rounds.
        let mut each: Vec<f64> = c["rounds_ms"].as_array().unwrap().iter().map(|r| r.as_f64().unwrap()).collect();
        each.sort_by(f64::total_cmp);
        assert_eq!((each.len(), Some(each[1])), (3, c["ms"].as_f64()), "{v}");
    }
    assert_eq!(v["timers_fired"], 200, "{v}");
    for field in ["lateness_max_ms", "lateness_p99_ms", "lateness_p50_ms", "timers_within_1s"] {
        assert!(v[field].as_i64().is_some(), "{field}: {v}");
    }
    assert!(v["rss_idle_mb"].as_f64().is_some_and(|mb| mb >= 0.0), "{v}");
    assert!(v["claim_last_over_first"].as_f64().is_some(), "{v}");
}

#[test]
fn dormant_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    check_dormant(dir.path().join("dormant.db").to_str().unwrap());
}

#[test]
fn dormant_on_postgres() {
    let Some(url) = settle_store::postgres::test_url("bench_dormant") else { return };
    check_dormant(&url);
}

/// `bench schedule`, small: every entity takes the fire's event once; the fire's lateness
/// and the idle RSS are reported.
fn check_schedule(db: &str) {
    let v = bench(db, &["schedule", "--entities", "3000", "--lead", "3s"]);
    assert_eq!((v["entities"].as_u64(), v["ticked"].as_u64()), (Some(3000), Some(3000)), "{v}");
    for field in ["fire_late_ms", "all_ticked_after_ms"] {
        assert!(v[field].as_i64().is_some_and(|ms| ms >= 0), "{field}: {v}");
    }
    assert!(v["rss_idle_mb"].as_f64().is_some_and(|mb| mb >= 0.0), "{v}");
}

#[test]
fn schedule_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    check_schedule(dir.path().join("schedule.db").to_str().unwrap());
}

#[test]
fn schedule_on_postgres() {
    let Some(url) = settle_store::postgres::test_url("bench_schedule") else { return };
    check_schedule(&url);
}

/// `bench soak`, small: every workflow runs (a server with four resources, created then
/// deleted), the checkpoints say what the issue asks of them, and once the last retention
/// passes a round of pruning leaves no entity behind (on SQLite, at most the newest).
fn check_soak(db: &str) {
    let v =
        bench(db, &["soak", "--workflows", "120", "--retention", "1s", "--checkpoints", "3", "--concurrency", "16"]);
    assert_eq!((v["workflows"].as_u64(), v["transitions"].as_u64()), (Some(120), Some(120 * 17)), "{v}");
    let checkpoints = v["checkpoints"].as_array().unwrap();
    assert_eq!(checkpoints.len(), 3, "{v}");
    for c in checkpoints {
        for key in ["workflows", "rows", "db_bytes", "wf_per_s"] {
            assert!(c[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {c}");
        }
    }
    assert_eq!(checkpoints[2]["workflows"], 120, "{v}");
    // Every server and resource ended and went, but (SQLite) the newest entity and the one
    // with the newest history row, which stay until something newer exists.
    let left = v["after_prune"]["entities"].as_u64().unwrap();
    assert!(if db.ends_with(".db") { left <= 2 } else { left == 0 }, "every server and resource ended and went: {v}");
    assert!(v["last_over_second"]["rows"].as_f64().is_some(), "{v}");
}

#[test]
fn soak_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    check_soak(dir.path().join("soak.db").to_str().unwrap());
}

#[test]
fn soak_on_postgres() {
    let Some(url) = settle_store::postgres::test_url("benchsoak") else { return };
    check_soak(&url);
}

/// `bench bulk`, small: every seeded job is paused by one bulk operation, counted once; a
/// second run with the same request id follows that operation (already done) again.
fn check_bulk(db: &str) {
    let v = bench(db, &["bulk", "--entities", "700", "--request-id", "b-1"]);
    assert_eq!(
        (v["done"].as_u64(), v["failed"].as_u64(), v["resumed"].as_bool()),
        (Some(700), Some(0), Some(false)),
        "{v}"
    );
    assert!(v["entities_per_s"].as_f64().is_some_and(|r| r > 0.0), "{v}");
    let again = bench(db, &["bulk", "--entities", "700", "--request-id", "b-1"]);
    assert_eq!((again["resumed"].as_bool(), again["commanded_now"].as_u64()), (Some(true), Some(0)), "{again}");
}

#[test]
fn bulk_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    check_bulk(dir.path().join("bulk.db").to_str().unwrap());
}

#[test]
fn bulk_on_postgres() {
    let Some(url) = settle_store::postgres::test_url("bench_bulk") else { return };
    check_bulk(&url);
}

/// `settle bench ARGS` without `--db` (on scratch files), with `tmp` as the temporary
/// directory.
fn on_scratch(tmp: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_settle"))
        .arg("bench")
        .args(args)
        .env("SETTLE_LOG", "error")
        .env_remove("SETTLE_DB")
        .env("TMPDIR", tmp)
        .output()
        .expect("run settle bench")
}

/// `bench chain --concurrency A,B --rounds R` without `--db`: a sweep, each run on its own
/// scratch file (removed after it), reported as each concurrency's medians and its runs,
/// the peak and the knee; as a table for people; a concurrency listed twice is refused.
#[test]
fn a_sweep_of_chain_on_scratch_files() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep =
        |args: &[&str]| on_scratch(tmp.path(), &[&["chain", "--entities", "150", "--steps", "2"], args].concat());
    let o = sweep(&["--concurrency", "16,4", "--rounds", "3", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let points = v["sweep"].as_array().unwrap();
    assert_eq!(points.iter().map(|p| p["concurrency"].as_u64().unwrap()).collect::<Vec<_>>(), [4, 16], "{v}");
    for p in points {
        let runs = p["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 3, "{v}");
        // The point's throughput is the median of its runs'.
        let mut rates: Vec<f64> = runs.iter().map(|r| r[0].as_f64().unwrap()).collect();
        rates.sort_by(f64::total_cmp);
        assert_eq!(p["workflows_per_s"].as_f64(), Some(rates[1]), "{v}");
        assert!(runs.iter().all(|r| r[2].as_f64().unwrap() >= r[1].as_f64().unwrap()), "p99 below p50: {v}");
    }
    let best = points.iter().map(|p| p["workflows_per_s"].as_f64().unwrap()).fold(0.0, f64::max);
    assert_eq!(v["peak"]["workflows_per_s"].as_f64(), Some(best), "{v}");
    assert!(v["knee"]["concurrency"].as_u64() <= v["peak"]["concurrency"].as_u64(), "{v}");
    assert!(v["knee"]["workflows_per_s"].as_f64().unwrap() >= 0.9 * best, "{v}");
    assert_eq!((v["workflows"].as_u64(), v["rounds"].as_u64(), v["steps"].as_u64()), (Some(150), Some(3), Some(2)));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "scratch files left behind: {left:?}");

    let o = sweep(&["--concurrency", "8,2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(
        out.contains("in flight  workflows/s") && out.contains("peak: ") && out.contains("knee (the least"),
        "{out}"
    );
    assert!(err.contains("run 1/2: 2 in flight") && err.contains("run 2/2: 8 in flight"), "{err}");

    let o = sweep(&["--concurrency", "8,4,8"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--concurrency lists 8 twice"), "{}", stderr(&o));
}

/// `bench chain --rate R`: an open loop. One rate: the plain report with `rate` and no
/// `concurrency`, every workflow done; several: a sweep by rate with each one's medians
/// and runs and the highest rate kept up with; a table for people; `--rate` with
/// `--concurrency`, a zero rate or a rate listed twice refused.
#[test]
fn an_open_loop_of_chain() {
    let tmp = tempfile::tempdir().unwrap();
    let chain =
        |args: &[&str]| on_scratch(tmp.path(), &[&["chain", "--entities", "120", "--steps", "2"], args].concat());
    // 120 workflows at 400 a second: their starts alone take 0.3 s.
    let o = chain(&["--rate", "400", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!((v["rate"].as_u64(), v["workflows"].as_u64()), (Some(400), Some(120)), "{v}");
    assert!(v.get("concurrency").is_none(), "{v}");
    assert!(v["seconds"].as_f64().unwrap() >= 119.0 / 400.0, "{v}");
    assert!(v["workflows_per_s"].as_f64().unwrap() <= 400.0 * 120.0 / 119.0, "{v}");
    assert!(v["p99_ms"].as_f64() >= v["p50_ms"].as_f64(), "{v}");
    // Kept up: at least 95 % of the rate done a second.
    assert_eq!(v["kept_up"].as_bool(), Some(v["workflows_per_s"].as_f64().unwrap() >= 0.95 * 400.0), "{v}");
    let o = chain(&["--rate", "400"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("open loop: 400 started a second; the engine "), "{out}");
    assert!(stderr(&o).contains("running 120 workflows, 400 started a second (open loop)"), "{}", stderr(&o));

    let o = chain(&["--rate", "300,150", "--rounds", "2", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let points = v["sweep"].as_array().unwrap();
    assert_eq!(points.iter().map(|p| p["rate"].as_u64().unwrap()).collect::<Vec<_>>(), [150, 300], "{v}");
    assert!(points.iter().all(|p| p["runs"].as_array().unwrap().len() == 2), "{v}");
    assert!(v.get("peak").is_none() && v.get("knee").is_none(), "{v}");
    // Kept up with: the highest rate whose median throughput is at least 95 % of it.
    let kept =
        points.iter().rev().find(|p| p["workflows_per_s"].as_f64().unwrap() >= 0.95 * p["rate"].as_f64().unwrap());
    assert_eq!(
        v["kept_up"],
        kept.cloned().map_or(Value::Null, |mut p| {
            p.as_object_mut().unwrap().remove("runs");
            p
        }),
        "{v}"
    );

    let o = chain(&["--rate", "200,100"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(out.contains("  rate/s   workflows/s") && out.contains("kept up (at least 95 % of the rate)"), "{out}");
    assert!(err.contains("run 1/2: 100 started a second (open loop)"), "{err}");

    for (args, says) in [
        (&["--rate", "100", "--concurrency", "8"][..], "cannot be used with"),
        (&["--rate", "0"][..], "--rate must be at least 1"),
        (&["--rate", "100,50,100"][..], "--rate lists 100 twice"),
    ] {
        let o = chain(args);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "scratch files left behind: {left:?}");
}

/// `bench chain --deploy`: a pinning version deployed halfway through the run; every
/// workflow finishes and ends under it (the bench fails otherwise).
fn check_deploy(v: &Value, workflows: u64) {
    assert_eq!(v["workflows"], workflows, "{v}");
    let d = &v["deploy"];
    assert_eq!(d["version"].as_str().map(str::len), Some(12), "{v}");
    assert!(d["moved"].as_u64().is_some() && d["pinned"].as_u64().is_some(), "{v}");
}

#[test]
fn chain_with_a_deploy_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("deploy.db");
    let v =
        bench(db.to_str().unwrap(), &["chain", "--entities", "400", "--steps", "3", "--concurrency", "32", "--deploy"]);
    check_deploy(&v, 400);
    assert_eq!(v["deploy"]["settled_after"], 0, "every pinned workflow moved on its own: {v}");
    // `settle machines` counts every entity under the new version.
    let o = settle(Path::new(&db), &["machines", "--json"]);
    let rows: Vec<Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let chain: Vec<&Value> = rows.iter().filter(|r| r["machine"] == "chain3").collect();
    assert_eq!(chain.len(), 2, "{rows:?}");
    assert_eq!((chain[0]["entities"].as_u64(), chain[1]["entities"].as_u64()), (Some(0), Some(400)), "{rows:?}");
    assert_eq!(chain[1]["current"], true);
}

#[test]
fn chain_with_a_deploy_on_postgres() {
    for instances in ["0", "1"] {
        let Some(url) = settle_store::postgres::test_url("benchdeploy") else { return };
        let v = bench(
            &url,
            &[
                "chain",
                "--entities",
                "200",
                "--steps",
                "3",
                "--concurrency",
                "16",
                "--instances",
                instances,
                "--deploy",
            ],
        );
        check_deploy(&v, 200);
    }
}

/// `bench limits`, small, on scratch files: both throughput runs finish (the limit never
/// exceeded: the bench fails otherwise), the late tenant's first workflow starts, nothing
/// is left behind; `--db` is refused (its databases are its own).
#[test]
fn limits_on_scratch_files() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["limits", "--workflows", "300", "--tenants", "6", "--flood", "300", "--work-ms", "5", "--rounds", "1"];
    let o = on_scratch(tmp.path(), &[&args[..], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        (v["workflows"].as_u64(), v["tenants"].as_u64(), v["per_tenant"].as_u64()),
        (Some(300), Some(6), Some(5))
    );
    for field in ["plain_workflows_per_s", "limited_workflows_per_s", "limited_over_plain"] {
        assert!(v[field].as_f64().is_some_and(|x| x > 0.0), "{field}: {v}");
    }
    assert!(v["late_first_start_ms"].as_f64().is_some_and(|ms| ms >= 0.0), "{v}");
    assert_eq!(v["of"], "actions");
    // The same limits counting whole workflows (from `go` until the entity is at rest).
    let o = on_scratch(tmp.path(), &[&args[..], &["--of", "workflows", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["of"], "workflows");
    assert!(v["limited_over_plain"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "scratch files left behind: {left:?}");
    let db = tmp.path().join("given.db");
    let o = settle(&db, &[&["bench"][..], &args].concat());
    assert!(!o.status.success() && stderr(&o).contains("drop --db"), "{}", stderr(&o));
    assert!(!db.exists(), "nothing opened");
}
