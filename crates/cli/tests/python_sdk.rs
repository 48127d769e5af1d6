//! Agents without Rust (DESIGN §5): the Python package `sdks/python` passes its own tests
//! against this build's `settle serve`, and the reference control plane built with it
//! (`examples/control-plane-python`: TOML machines and Python agents only), its provider
//! calls limited to two at once per region, brings 50
//! logical servers to rest, a fifth of their provisionings failing for good and half of
//! them deleted afterwards, as its `run.py` checks from the store.
//!
//! Skipped (with a note) when `python3` is not on PATH, unless `CI` is set.

mod common;

use std::process::Command;

use common::{python3, repo};
use serde_json::Value;

#[test]
fn the_python_package_passes_its_tests_against_a_real_server() {
    if !python3() {
        return;
    }
    let out = Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(repo().join("sdks/python/tests"))
        .env("PYTHONPATH", repo().join("sdks/python/src"))
        .env("SETTLE", env!("CARGO_BIN_EXE_settle"))
        .env("SETTLE_REQUIRE_SDK", "1")
        .output()
        .expect("run python3");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the package's tests failed:\n{log}");
    assert!(!log.contains("skipped"), "no test may skip with a server at hand:\n{log}");
}

#[test]
fn the_control_plane_without_rust_brings_every_server_to_rest() {
    if !python3() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cp.db");
    let out = Command::new("python3")
        .arg(repo().join("examples/control-plane-python/run.py"))
        .args(["--servers", "50", "--fail-rate", "0.2", "--delete-half", "--timeout", "300", "--region-limit", "2"])
        .arg("--db")
        .arg(&db)
        .env("SETTLE", env!("CARGO_BIN_EXE_settle"))
        .env_remove("PYTHONPATH")
        .output()
        .expect("run python3");
    let log = String::from_utf8_lossy(&out.stderr);
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "run.py failed ({}):\n{line}\n{log}", out.status);
    let result: Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(result["ok"], true, "{result}");
    let servers = &result["counts"]["server"];
    let count = |state: &str| servers[state].as_u64().unwrap_or(0);
    assert_eq!(count("gone"), 25, "every second server deleted: {result}");
    assert_eq!(count("ready") + count("failed"), 25, "{result}");
    // With a fifth of the provisionings failing, both endings must have happened, or the
    // run proves less than it says.
    assert!(count("failed") > 0 && count("ready") > 0, "{result}");
    // The provider never saw more than 2 calls of a region at once (run.py fails the run
    // otherwise), and the limit bound: some region had 2.
    let most = result["most_calls_at_once"].as_object().unwrap_or_else(|| panic!("{result}"));
    assert_eq!(most.len(), 3, "three regions: {result}");
    assert!(most.values().all(|n| n.as_u64().unwrap() <= 2), "{result}");
    assert!(most.values().any(|n| n.as_u64() == Some(2)), "the limit never bound: {result}");
    for kind in ["app", "database", "alias", "dns"] {
        let states = result["counts"][kind].as_object().unwrap_or_else(|| panic!("no {kind}: {result}"));
        let total: u64 = states.values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(total, 50, "one {kind} per server: {result}");
    }
}
