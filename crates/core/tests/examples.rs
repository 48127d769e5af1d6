//! Every example machine loads: all of `examples/machines/*.toml` without errors or
//! warnings, and together as a set (with the one warning the set deserves); those of
//! `examples/control-plane-python` too; `examples/invalid/broken.toml` shows every kind of
//! report at once.

use std::path::{Path, PathBuf};

use settle_core::{Machine, Report};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Loads `examples/<file>` (e.g. `machines/server.toml`), naming it by that relative path
/// in diagnostics.
fn load_example(file: &str) -> Result<(Machine, Report), Report> {
    let path = examples_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let stem = Path::new(file).file_stem().and_then(|s| s.to_str()).expect("a .toml file");
    settle_core::toml::load(&format!("examples/{file}"), stem, &text)
}

/// Loads `examples/machines/<file>`.
fn load(file: &str) -> Result<(Machine, Report), Report> {
    load_example(&format!("machines/{file}"))
}

#[test]
fn every_example_machine_loads_cleanly_and_the_set_checks() {
    let mut files: Vec<String> = std::fs::read_dir(examples_dir().join("machines"))
        .expect("examples/machines exists")
        .map(|e| e.expect("readable directory entry").file_name().into_string().expect("utf-8 file name"))
        .filter(|f| f.ends_with(".toml"))
        .collect();
    files.sort();
    assert!(files.iter().any(|f| f == "server.toml"), "server.toml is among {files:?}");
    let mut set = Vec::new();
    for file in &files {
        match load(file) {
            Ok((m, warnings)) => {
                assert!(warnings.diagnostics.is_empty(), "{file}: unexpected warnings:\n{warnings}");
                set.push(m);
            }
            Err(report) => panic!("{file} does not load:\n{report}"),
        }
    }
    let set: Vec<&Machine> = set.iter().collect();
    // Served together, the logical server's subscriptions have nothing to select: no
    // action of these machines may create its resources (they are not among them).
    assert_eq!(warnings_of(&set), no_successors("logical_server"), "served together");
}

/// The warnings of a set, as lines; anything else in its report fails the test.
fn warnings_of(set: &[&Machine]) -> Vec<String> {
    let report = settle_core::validate::check_set(set);
    assert!(report.diagnostics.iter().all(|d| d.severity == settle_core::validate::Severity::Warning), "{report}");
    report.diagnostics.iter().map(ToString::to_string).collect()
}

/// The warnings of the logical server's two subscriptions over any successor.
fn no_successors(machine: &str) -> Vec<String> {
    ["resources_ready", "resources_failed"]
        .map(|e| {
            format!(
                "warning: machine `{machine}`, event `{e}`: `subscribe`: no action in the set may create or join any \
                 entity, so the pattern has no successors to select (declare `may_create` on the action that creates them)"
            )
        })
        .to_vec()
}

/// The reference control plane without Rust (`examples/control-plane-python/machines`):
/// every machine loads without a warning, and the set checks clean, the subscriptions
/// included (the server's agent action declares what it creates).
#[test]
fn the_control_plane_without_rust_loads_and_checks_clean() {
    let mut set = Vec::new();
    for name in ["server", "app", "database", "alias", "dns"] {
        let (m, warnings) =
            load_example(&format!("control-plane-python/machines/{name}.toml")).unwrap_or_else(|r| panic!("{r}"));
        assert!(warnings.diagnostics.is_empty(), "{name}: {warnings}");
        set.push(m);
    }
    let set: Vec<&Machine> = set.iter().collect();
    assert_eq!(settle_core::validate::check_set(&set), Report::default());
}

#[test]
fn server_example_is_the_reference_shape() {
    let (m, _) = load("server.toml").expect("server.toml loads");
    assert_eq!(m.name().as_str(), "server");
    assert_eq!(m.initial().name, "new");
    assert_eq!(m.state("ready").expect("ready").requires, ["endpoint"]);
    assert_eq!(m.state("gone").expect("gone").kind, settle_core::StateKind::Deleted);
    assert_eq!(m.state("failed").expect("failed").health, settle_core::Health::Error);
    let policy = m.fault_policy();
    assert_eq!((policy.max_errors, policy.window), (5, std::time::Duration::from_secs(3600)));
    assert_eq!(policy.backoff(1), std::time::Duration::from_secs(2));
    assert_eq!(policy.backoff(10), std::time::Duration::from_secs(300));
}

#[test]
fn logical_server_example_subscribes_and_runs_a_timer() {
    let (m, _) = load("logical_server.toml").expect("logical_server.toml loads");
    let subs: Vec<String> = m
        .subscriptions_in("awaiting_resources")
        .map(|e| format!("{}: {}", e.name, e.subscribe.as_ref().expect("a subscription").pattern))
        .collect();
    assert_eq!(subs, ["resources_ready: all(*) in [ready]", "resources_failed: any(*) health error"]);
    let timers: Vec<String> = m.timers_in("degraded").map(|t| format!("{} {}", t.name, t.schedule)).collect();
    assert_eq!(timers, ["health every 5m"]);
    // Checked against itself only, `ready` exists (in the subscriber), and no action may
    // create successors; the real set adds the successors' machines.
    assert_eq!(warnings_of(&[&m]), no_successors("logical_server"));
}

#[test]
fn broken_example_reports_every_problem() {
    let report = load_example("invalid/broken.toml").expect_err("broken.toml is refused");
    let expected = "\
examples/invalid/broken.toml:8: error: machine `broken`, state `working`: `auto` names unknown action `work_harder`
examples/invalid/broken.toml:8: error: machine `broken`, state `working`: unstable state must have exactly one auto action, found 2
examples/invalid/broken.toml:11: error: machine `broken`, state `idle`: `wait` declared without an auto action
examples/invalid/broken.toml:20: error: machine `broken`, event `start`: `in` names unknown state `nowhere`
examples/invalid/broken.toml:20: error: machine `broken`, event `start`: rejection reason for `new`, where the event is valid
examples/invalid/broken.toml:26: error: machine `broken`, event `revive`: valid in deleted state `gone`, which nothing may leave
examples/invalid/broken.toml:26: error: machine `broken`, event `revive`: `subscribe`: expected `[` after `in` at column 11
examples/invalid/broken.toml:34: error: machine `broken`, action `work`: wait declared for `new`, a target outside the declared set
examples/invalid/broken.toml:38: error: machine `broken`, action `give_up`: no target states (`to` is empty)
examples/invalid/broken.toml:41: error: machine `broken`, timer `poll`: `event` names unknown event `poke`
examples/invalid/broken.toml:41: error: machine `broken`, timer `poll`: `every` is zero (a timer firing continuously is a busy loop)
examples/invalid/broken.toml:11: warning: machine `broken`, state `idle`: no event leaves this stable state (declare `kind = \"terminal\"` if that is intended)
examples/invalid/broken.toml:17: warning: machine `broken`, state `gone`: unreachable from the initial state `new`
";
    assert_eq!(report.to_string(), expected);
}

/// The seed's bug tracker (`examples/bugtracker/bug.toml`) loads without a warning, reads
/// back from its TOML rendering as the same definition, and its diagram shows the re-assign as
/// a re-entry of `assigned`.
#[test]
fn the_bug_tracker_loads_cleanly_and_draws_its_re_entry() {
    let (m, warnings) = load_example("bugtracker/bug.toml").unwrap_or_else(|r| panic!("{r}"));
    assert!(warnings.diagnostics.is_empty(), "unexpected warnings:\n{warnings}");
    let again = settle_core::toml::load("bug.toml", "bug", &m.to_toml()).unwrap_or_else(|r| panic!("{r}")).0;
    assert_eq!(again.content_hash(), m.content_hash(), "the TOML rendering reads back as the same definition");
    let diagram = settle_core::graph::render(&m, settle_core::graph::Format::Mermaid);
    assert!(diagram.contains("assigned --> assigned : assign (re-entry)"), "{diagram}");
    assert!(diagram.contains("entry from assign / store_assignee, exit / deassign"), "{diagram}");
}
