//! Where a command's machines come from, end to end (issue 65), on SQLite and (with
//! `SETTLE_TEST_PG`) PostgreSQL: on a database holding the Python control plane's
//! definitions, every command of README's table run without `--machines` leaves the stored
//! definitions, their current versions and every entity's version as they were (the
//! read-only commands and the dry runs: every table); `settle serve` without `--machines`
//! serves the stored definitions, or refuses naming the handler a stored one needs; a
//! deploy of five versions whose fourth is refused leaves all five as they were, by `settle
//! deploy` and by an engine's start; `SETTLE_SERVER` in the environment stops no local
//! command; a database whose definitions the built-in ones replaced is repaired by one
//! `settle deploy`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use common::{Served, http, repo, stderr, stdout};

/// A database of one of the two stores, and what its tables hold.
enum Db {
    Sqlite(PathBuf),
    Pg { url: String, base: String, schema: String },
}

impl Db {
    /// A fresh SQLite file in `dir`, or a fresh PostgreSQL schema (`None` if
    /// `SETTLE_TEST_PG` is unset: the test says it skipped).
    fn fresh(dir: &Path, pg: bool, name: &str) -> Option<Db> {
        if !pg {
            return Some(Db::Sqlite(dir.join(format!("{name}.db"))));
        }
        let url = settle_store::postgres::test_url(name)?;
        let (base, schema) = url.split_once("?schema=").expect("a schema in the URL");
        Some(Db::Pg { base: base.to_string(), schema: schema.to_string(), url })
    }

    fn arg(&self) -> &Path {
        match self {
            Db::Sqlite(p) => p,
            Db::Pg { url, .. } => Path::new(url),
        }
    }

    /// `settle --db DB ARGS...` with `env` set, `SETTLE_SERVER`/`SETTLE_MACHINES` cleared.
    fn settle_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_settle"))
            .arg("--db")
            .arg(self.arg())
            .args(args)
            .env("SETTLE_LOG", "error")
            .env_remove("SETTLE_SERVER")
            .env_remove("SETTLE_MACHINES")
            .env_remove("SETTLE_TOKENS")
            .envs(env.iter().copied())
            .output()
            .expect("run settle")
    }

    fn settle(&self, args: &[&str]) -> Output {
        self.settle_env(args, &[])
    }

    /// `settle --db DB run` for `time`, then stopped with SIGTERM.
    fn run_for(&self, time: Duration) -> Output {
        self.run_for_env(&[], &[], time)
    }

    /// `settle --db DB FLAGS... run` with `env`, for `time`, then stopped with SIGTERM.
    fn run_for_env(&self, flags: &[&str], env: &[(&str, &str)], time: Duration) -> Output {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_settle"))
            .arg("--db")
            .arg(self.arg())
            .args(flags)
            .arg("run")
            .env("SETTLE_LOG", "error")
            .env_remove("SETTLE_SERVER")
            .env_remove("SETTLE_MACHINES")
            .env_remove("SETTLE_TOKENS")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(time);
        let term = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        assert!(term.success());
        child.wait_with_output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.settle(args);
        assert!(o.status.success(), "settle {args:?}: {}{}", stderr(&o), stdout(&o));
        stdout(&o)
    }

    /// Rows of `sql` (one text column), in order.
    fn rows(&self, sql: &str) -> Vec<String> {
        match self {
            Db::Sqlite(path) => {
                let c =
                    rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
                let mut s = c.prepare(sql).unwrap();
                s.query_map([], |r| r.get::<_, String>(0)).unwrap().map(Result::unwrap).collect()
            }
            Db::Pg { base, schema, .. } => {
                let mut c = postgres::Client::connect(base, postgres::NoTls).unwrap();
                c.batch_execute(&format!("SET search_path TO \"{schema}\"")).unwrap();
                c.query(sql, &[]).unwrap().iter().map(|r| r.get::<_, String>(0)).collect()
            }
        }
    }

    /// Every stored version, whole.
    fn definitions(&self) -> Vec<String> {
        self.rows(
            "SELECT name || ' ' || hash || ' ' || created_at || ' ' || origin || ' ' || definition FROM machines
             ORDER BY name, created_at",
        )
    }

    /// The current version of each machine: `name hash`.
    fn current(&self) -> Vec<String> {
        self.rows(
            "SELECT m.name || ' ' || m.hash FROM machines m
             WHERE m.created_at = (SELECT MAX(created_at) FROM machines n WHERE n.name = m.name) ORDER BY m.name",
        )
    }

    /// Each entity and the definition version it runs under.
    fn entity_versions(&self) -> Vec<String> {
        self.rows(
            "SELECT machine || '/' || key || ' ' || COALESCE(machine_hash, '-') FROM entities ORDER BY machine, key",
        )
    }

    /// What no command may change unasked: the definitions stored and their current versions.
    fn deployment(&self) -> Vec<String> {
        [self.definitions(), self.current()].concat()
    }

    /// Every row of every table of Settle's, as text.
    fn everything(&self) -> Vec<String> {
        let tables = match self {
            Db::Sqlite(_) => self.rows("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"),
            Db::Pg { schema, .. } => self.rows(&format!(
                "SELECT table_name::text FROM information_schema.tables
                 WHERE table_schema = '{schema}' AND table_type = 'BASE TABLE' ORDER BY 1"
            )),
        };
        let mut all = Vec::new();
        for t in tables {
            let rows = match self {
                Db::Sqlite(_) => {
                    let cols = self.rows(&format!("SELECT name FROM pragma_table_info('{t}') ORDER BY cid"));
                    let row = cols.iter().map(|c| format!("quote(\"{c}\")")).collect::<Vec<_>>().join(" || '|' || ");
                    self.rows(&format!("SELECT {row} FROM \"{t}\" ORDER BY 1"))
                }
                Db::Pg { .. } => self.rows(&format!("SELECT row_to_json(t)::text FROM \"{t}\" t ORDER BY 1")),
            };
            all.extend(rows.into_iter().map(|r| format!("{t}: {r}")));
        }
        all
    }

    /// Drops the schema (PostgreSQL) once the test passed.
    fn drop(self) {
        if let Db::Pg { base, schema, .. } = self {
            let mut c = postgres::Client::connect(&base, postgres::NoTls).unwrap();
            c.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")).unwrap();
        }
    }
}

/// Asserts `after` equals `before`, naming the rows that differ (shortened).
fn same(before: &[String], after: &[String], what: &str) {
    if before == after {
        return;
    }
    let short = |r: &&String| r.chars().take(160).collect::<String>();
    let gone: Vec<String> = before.iter().filter(|r| !after.contains(r)).map(|r| short(&r)).collect();
    let came: Vec<String> = after.iter().filter(|r| !before.contains(r)).map(|r| short(&r)).collect();
    panic!("{what} changed: rows gone {gone:#?}, rows new {came:#?}");
}

/// The Python control plane's machines (TOML; its actions run by agents).
fn control_plane() -> PathBuf {
    repo().join("examples/control-plane-python/machines")
}

/// Its five files, as `settle deploy` takes them.
fn control_plane_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(control_plane())
        .unwrap()
        .map(|e| e.unwrap().path().display().to_string())
        .filter(|p| p.ends_with(".toml"))
        .collect();
    files.sort();
    files
}

/// A deployment of the control plane: `s1` new, `s2` creating (its agent task open), `a1`
/// provisioning, `d1` paused; made as a user would, with `--machines`.
fn deployed(db: &Db) {
    let dir = control_plane();
    let m = dir.to_str().unwrap();
    for (machine, key) in [("server", "s1"), ("server", "s2"), ("app", "a1"), ("dns", "d1")] {
        db.ok(&["--machines", m, "create", machine, key]);
    }
    // Processed until their agents' tasks wait (no agent runs here).
    for raise in [
        ["server", "s2", "create", "--idempotency-key", "s2-create"],
        ["app", "a1", "start", "--idempotency-key", "a1-start"],
    ] {
        let args = [&["--machines", m, "raise"][..], &raise[..], &["--wait=stable", "--timeout", "2s"]].concat();
        let o = db.settle(&args);
        assert!(stderr(&o).contains("timed out"), "{}{}", stderr(&o), stdout(&o));
    }
    db.ok(&["pause", "dns", "d1"]);
    assert_eq!(db.current().len(), 5, "the control plane's five machines: {:?}", db.current());
}

/// What a command must leave as it was.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Leaves {
    /// Every table (a read-only command, a dry run, or a refusal).
    Everything,
    /// The definitions, their current versions and every entity's version.
    Deployment,
}

fn every_command_keeps_the_deployment(pg: bool) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = Db::fresh(dir.path(), pg, "every_command") else { return };
    deployed(&db);
    let files = control_plane_files();
    let mut deploy: Vec<&str> = vec!["deploy"];
    deploy.extend(files.iter().map(String::as_str));
    let mut deploy_dry = deploy.clone();
    deploy_dry.push("--dry-run");
    use Leaves::{Deployment, Everything};
    // (arguments, what it leaves, whether it must succeed: None when either is fine)
    let commands: Vec<(Vec<&str>, Leaves, Option<bool>)> = vec![
        (vec!["list"], Everything, Some(true)),
        (vec!["list", "--machine", "server", "--json"], Everything, Some(true)),
        (vec!["get", "server", "s1"], Everything, Some(true)),
        (vec!["history", "server", "s2"], Everything, Some(true)),
        (vec!["history", "server", "s2", "--events"], Everything, Some(true)),
        (vec!["ops"], Everything, Some(true)),
        (vec!["op", "s2-create"], Everything, Some(true)),
        (vec!["related", "server", "s2"], Everything, Some(true)),
        (vec!["why", "server", "s1"], Everything, None),
        (vec!["feed", "--since", "0", "--once"], Everything, Some(true)),
        (vec!["stats"], Everything, Some(true)),
        (vec!["machines"], Everything, Some(true)),
        (vec!["check", "server", "s1", "create"], Everything, Some(true)),
        (vec!["schedules"], Everything, Some(true)),
        (vec!["prune", "--dry-run"], Everything, Some(true)),
        (vec!["bulk", "run", "pause", "--machine", "app", "--reason", "look", "--dry-run"], Everything, Some(true)),
        (vec!["bulk", "list"], Everything, Some(true)),
        (deploy_dry, Everything, Some(true)),
        (vec!["demo", "--servers", "1"], Everything, Some(false)),
        (vec!["bench", "chain", "--entities", "4"], Everything, Some(false)),
        (vec!["create", "server", "s9"], Deployment, Some(true)),
        (vec!["raise", "server", "s9", "create"], Deployment, Some(true)),
        (vec!["pause", "server", "s1"], Deployment, Some(true)),
        (vec!["resume", "server", "s1"], Deployment, Some(true)),
        (vec!["sleep", "server", "s1", "--until", "+1h"], Deployment, Some(true)),
        (vec!["retry", "server", "s1"], Deployment, None),
        (vec!["release", "server", "s1"], Deployment, Some(true)),
        (vec!["kill", "dns", "d1"], Deployment, Some(true)),
        (vec!["raise", "server", "s1", "create", "--wait", "--timeout", "1s"], Deployment, None),
        (vec!["cancel", "s2-create", "--reason", "test"], Deployment, Some(true)),
        (vec!["bulk", "run", "resume", "--machine", "app", "--reason", "test"], Deployment, Some(true)),
        (vec!["prune"], Deployment, Some(true)),
        (vec!["run"], Deployment, Some(true)),
        (deploy, Deployment, Some(true)),
    ];
    for (args, leaves, succeeds) in commands {
        let (deployment, versions, everything) = (db.deployment(), db.entity_versions(), db.everything());
        let o = if args == ["run"] { db.run_for(Duration::from_secs(2)) } else { db.settle(&args) };
        if let Some(want) = succeeds {
            assert_eq!(o.status.success(), want, "settle {args:?}: {}{}", stderr(&o), stdout(&o));
        }
        same(&deployment, &db.deployment(), &format!("settle {args:?}: the definitions ({})", stderr(&o)));
        // Every entity runs under the version it ran under (new ones may have come).
        let now = db.entity_versions();
        let moved: Vec<&String> = versions.iter().filter(|v| !now.contains(v)).collect();
        assert!(moved.is_empty(), "settle {args:?} moved {moved:?}");
        if leaves == Everything {
            same(&everything, &db.everything(), &format!("settle {args:?}: the tables ({})", stderr(&o)));
        }
    }
    // The demo and the benchmarks say why they refused.
    let o = db.settle(&["demo", "--servers", "1"]);
    assert!(stderr(&o).contains("holds definitions of its own"), "{}", stderr(&o));
    let text = db.ok(&["deploy", &control_plane_files()[0]]);
    assert!(text.contains("unchanged"), "{text}");
    db.drop();
}

#[test]
fn every_command_without_machines_keeps_the_stored_definitions_on_sqlite() {
    every_command_keeps_the_deployment(false);
}

#[test]
fn every_command_without_machines_keeps_the_stored_definitions_on_postgres() {
    every_command_keeps_the_deployment(true);
}

fn serve_runs_what_is_stored(pg: bool) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = Db::fresh(dir.path(), pg, "serve_stored") else { return };
    deployed(&db);
    let (definitions, current) = (db.definitions(), db.current());
    let s = Served::start(db.arg(), None, &[]);
    let addr = s.url.strip_prefix("http://").unwrap().to_string();
    let (status, body) = http(&addr, "GET", "/v1/machines", None);
    assert_eq!(status, 200, "{body}");
    let mut names: Vec<&str> = body["items"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["alias", "app", "database", "dns", "server"], "the stored definitions, no built-in one");
    let (status, body) = http(&addr, "POST", "/v1/machines/server/entities", Some(r#"{"key": "h1"}"#));
    assert_eq!(status, 201, "{body}");
    let (status, _) = http(&addr, "POST", "/v1/machines/chain1/entities", Some(r#"{"key": "c1"}"#));
    assert_eq!(status, 404, "the built-in machines are not merged in");
    assert!(s.stop().success());
    assert_eq!((db.definitions(), db.current()), (definitions, current), "definitions unchanged");
    // A stored definition whose action needs a Rust handler: serve refuses, naming it,
    // and changes nothing.
    let extra = dir.path().join("extra");
    std::fs::create_dir_all(&extra).unwrap();
    let picker = "initial = \"a\"\n[states.a]\n[states.b]\n[states.c]\n[events.go]\nin = [\"a\"]\naction = \"pick\"\n\
                  [actions.pick]\nto = [\"b\", \"c\"]\n";
    std::fs::write(extra.join("picker.toml"), picker).unwrap();
    let text = db.ok(&["deploy", extra.join("picker.toml").to_str().unwrap()]);
    assert!(text.contains("deployed picker"), "a deploy needs no handler: {text}");
    let everything = db.everything();
    let o = db.settle(&["serve", "--listen", "127.0.0.1:0"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no handler for action `pick` of machine `picker`"), "{}", stderr(&o));
    same(&everything, &db.everything(), "a refused start of serve");
    db.drop();
}

#[test]
fn serve_without_machines_runs_the_stored_definitions_on_sqlite() {
    serve_runs_what_is_stored(false);
}

#[test]
fn serve_without_machines_runs_the_stored_definitions_on_postgres() {
    serve_runs_what_is_stored(true);
}

/// Five machines, `a` -go→ `b`; version 2 renames `b` to `bb` (its entities move), except
/// that with `strand` the fourth drops `b` (an entity there would have no home).
fn five(dir: &Path, v: u32, strand: bool) -> PathBuf {
    let out = dir.join(format!("v{v}{}", if strand { "s" } else { "" }));
    std::fs::create_dir_all(&out).unwrap();
    for i in 1..=5 {
        let text = match (v, strand && i == 4) {
            (1, _) => {
                "initial = \"a\"\n[states.a]\n[states.b]\n[events.go]\nin = [\"a\"]\naction = \"go\"\n\
                       [actions.go]\nto = [\"b\"]\n"
            }
            (_, false) => {
                "initial = \"a\"\n[states.a]\n[states.bb]\nrenamed_from = [\"b\"]\n[events.go]\n\
                           in = [\"a\"]\naction = \"go\"\n[actions.go]\nto = [\"bb\"]\n"
            }
            (_, true) => {
                "initial = \"a\"\n[states.a]\n[states.c]\n[events.go]\nin = [\"a\"]\naction = \"go\"\n\
                          [actions.go]\nto = [\"c\"]\n"
            }
        };
        std::fs::write(out.join(format!("m{i}.toml")), text).unwrap();
    }
    out
}

fn files_of(dir: &Path) -> Vec<String> {
    (1..=5).map(|i| dir.join(format!("m{i}.toml")).display().to_string()).collect()
}

fn a_refused_fourth_leaves_all_five(pg: bool) {
    let dir = tempfile::tempdir().unwrap();
    let Some(db) = Db::fresh(dir.path(), pg, "fourth") else { return };
    let v1 = five(dir.path(), 1, false);
    for i in 1..=5 {
        let m = format!("m{i}");
        db.ok(&["--machines", v1.to_str().unwrap(), "create", &m, "k"]);
        db.ok(&["--machines", v1.to_str().unwrap(), "raise", &m, "k", "go", "--wait"]);
    }
    let before = db.everything();
    let stranding = five(dir.path(), 2, true);
    let mut deploy = vec!["deploy".to_string()];
    deploy.extend(files_of(&stranding));
    let args: Vec<&str> = deploy.iter().map(String::as_str).collect();
    let o = db.settle(&args);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("m4") && stderr(&o).contains("refused"), "{}", stderr(&o));
    same(&before, &db.everything(), "settle deploy of a refused fourth");
    let o = db.settle(&["--machines", stranding.to_str().unwrap(), "run", "--until-idle"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("m4"), "{}", stderr(&o));
    same(&before, &db.everything(), "an engine's refused start");
    // Without the stranding version: all five, every entity moved.
    let good = five(dir.path(), 2, false);
    let mut deploy = vec!["deploy".to_string()];
    deploy.extend(files_of(&good));
    let args: Vec<&str> = deploy.iter().map(String::as_str).collect();
    db.ok(&args);
    assert_eq!(db.rows("SELECT state FROM entities ORDER BY machine"), ["bb"; 5]);
    db.drop();
}

#[test]
fn a_deploy_of_five_whose_fourth_is_refused_changes_nothing_on_sqlite() {
    a_refused_fourth_leaves_all_five(false);
}

#[test]
fn a_deploy_of_five_whose_fourth_is_refused_changes_nothing_on_postgres() {
    a_refused_fourth_leaves_all_five(true);
}

/// `SETTLE_SERVER` in the environment stops no command that works on the database:
/// `serve --machines` and `run --machines` start, and `schedules` lists the schedules of
/// the definitions stored.
#[test]
fn settle_server_in_the_environment_stops_no_local_command() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::Sqlite(dir.path().join("env.db"));
    let examples = repo().join("examples/machines");
    let env = [("SETTLE_SERVER", "http://127.0.0.1:9")];
    let o = db.run_for_env(&["--machines", examples.to_str().unwrap()], &env, Duration::from_secs(2));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("processing due work"), "{}", stderr(&o));
    let o = db.settle_env(&["schedules"], &env);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed = stdout(&o);
    assert!(listed.contains("backup") && listed.contains("nightly"), "{listed}");
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_settle"));
    c.arg("--db").arg(db.arg()).args(["--machines", examples.to_str().unwrap(), "serve", "--listen", "127.0.0.1:0"]);
    c.env("SETTLE_LOG", "error").envs(env).env_remove("SETTLE_TOKENS");
    c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let (mut child, addr) = common::spawn_serve_command(&mut c);
    let (status, _) = http(&addr, "GET", "/healthz", None);
    assert_eq!(status, 200);
    let _ = child.kill();
    let _ = child.wait();
    // A command that goes to the server still refuses a --machines with it.
    let o = db.settle_env(&["--machines", examples.to_str().unwrap(), "list"], &env);
    assert!(!o.status.success());
}

/// A database whose definitions were replaced by the built-in machines (the old defect's
/// effect, written here directly: every built-in version stored as current, every entity
/// moved onto it) is repaired by one `settle deploy` of the user's files, after which the
/// Python control plane runs on it to `ok: true`.
#[test]
fn one_deploy_repairs_a_database_the_built_in_machines_took_over() {
    if !common::python3() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = Db::Sqlite(dir.path().join("taken.db"));
    db.ok(&["--machines", control_plane().to_str().unwrap(), "run", "--until-idle"]);
    // The accident: the built-in set deployed over the control plane's, with no origin.
    let built_in = dir.path().join("built-in.db");
    db_ok(&built_in, &["--builtin", "run", "--until-idle"]);
    let c = rusqlite::Connection::open(db.arg()).unwrap();
    c.execute("ATTACH DATABASE ?1 AS b", [built_in.to_str().unwrap()]).unwrap();
    c.execute(
        "INSERT INTO machines (name, hash, definition, created_at, origin)
         SELECT name, hash, definition, created_at + 1000000000000, '' FROM b.machines",
        [],
    )
    .unwrap();
    drop(c);
    let o = db.settle(&["serve", "--machines", control_plane().to_str().unwrap(), "--listen", "127.0.0.1:0"]);
    assert!(!o.status.success(), "the taken-over database no longer serves the control plane");
    let listed = db.ok(&["machines"]);
    assert!(listed.lines().any(|l| l.starts_with("server ") && l.contains('*') && l.contains("built-in")), "{listed}");
    // The repair, as README says.
    let mut deploy = vec!["deploy".to_string()];
    deploy.extend(control_plane_files());
    let args: Vec<&str> = deploy.iter().map(String::as_str).collect();
    let text = db.ok(&args);
    assert_eq!(text.matches("deployed ").count(), 5, "{text}");
    let run = std::process::Command::new("python3")
        .arg(repo().join("examples/control-plane-python/run.py"))
        .args(["--servers", "3", "--fail-rate", "0.2", "--timeout", "120", "--db"])
        .arg(db.arg())
        .env("SETTLE", env!("CARGO_BIN_EXE_settle"))
        .env_remove("SETTLE_SERVER")
        .env_remove("SETTLE_DB")
        .output()
        .unwrap();
    assert!(run.status.success(), "{}{}", stdout(&run), stderr(&run));
    let line: serde_json::Value = serde_json::from_str(stdout(&run).trim()).unwrap();
    assert_eq!(line["ok"], true, "{line}");
}

fn db_ok(db: &Path, args: &[&str]) {
    let o = common::settle(db, args);
    assert!(o.status.success(), "settle {args:?}: {}", stderr(&o));
}
