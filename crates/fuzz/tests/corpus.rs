//! Replays every file of `fuzz/corpus/<target>/` through its target: the inputs AFL found
//! (and the crashes fixed since) keep being checked without AFL.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target)
}

fn replay(target: &str) {
    let run = settle_fuzz::target(target).expect("a known target");
    let dir = corpus_dir(target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: cannot read the corpus: {e}", dir.display()));
    let mut files: Vec<PathBuf> =
        entries.map(|e| e.expect("a directory entry").path()).filter(|p| p.is_file()).collect();
    files.sort();
    assert!(!files.is_empty(), "{}: the corpus is empty", dir.display());
    let mut failed = Vec::new();
    for file in &files {
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
            failed.push(file.display().to_string());
        }
    }
    settle_fuzz::release(target);
    assert!(failed.is_empty(), "{target}: {} of {} inputs panic:\n{}", failed.len(), files.len(), failed.join("\n"));
}

#[test]
fn machine_toml_corpus() {
    replay("machine_toml");
}

#[test]
fn guard_corpus() {
    replay("guard");
}

#[test]
fn request_expr_corpus() {
    replay("request_expr");
}

/// A fixed count of generated request expressions (deep chains, nested comprehensions,
/// huge literals, mutations of them), on a thread with the runtime's worker stack (2 MiB):
/// each is refused or evaluated; none overflows the stack or panics.
#[test]
fn request_expr_generated() {
    const COUNT: u64 = 20_000;
    let seed = std::env::var("SETTLE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20_261_207);
    let run = std::thread::Builder::new().stack_size(2 << 20).spawn(move || {
        let mut accepted = 0;
        for n in 0..COUNT {
            let data = settle_fuzz::expr_target::generated(seed, n);
            if catch_unwind(AssertUnwindSafe(|| settle_fuzz::request_expr(&data))).is_err() {
                panic!("input {n} of seed {seed} panics: {:?}", String::from_utf8_lossy(&data));
            }
            accepted +=
                usize::from(settle_engine::Narrow::parse_expr(std::str::from_utf8(&data).unwrap_or("")).is_ok());
        }
        accepted
    });
    let accepted = run.unwrap().join().expect("no input crashed the thread");
    eprintln!(
        "{COUNT} generated request expressions (seed {seed}): {accepted} accepted and evaluated, the rest refused"
    );
    assert!(accepted > 0 && accepted < COUNT as usize, "both kinds were met: {accepted}");
}

#[test]
fn http_request_corpus() {
    replay("http_request");
}

#[test]
fn stored_json_corpus() {
    replay("stored_json");
}

#[test]
fn every_target_is_replayed() {
    let names: Vec<&str> = settle_fuzz::TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["machine_toml", "guard", "request_expr", "http_request", "stored_json"]);
}
