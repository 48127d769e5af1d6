//! settle-fuzz: Settle's fuzz targets, one plain function per target, each taking any bytes
//! and returning normally. A panic (or an abort, a hang) is a bug found.
//!
//! - [`machine_toml`]: a machine definition in TOML, loaded and validated as `settle
//!   validate` and the server load their `--machines` files, with the report rendered;
//! - [`guard`]: a guard expression, parsed, checked and evaluated against JSON data;
//! - [`request_expr`]: an expression as a request gives it (`where`), refused or evaluated
//!   (its generated run, [`expr_target::generated`], runs a fixed count in the tests);
//! - [`http_request`]: a request to the HTTP API, answered by the server's real router
//!   over a SQLite store in process;
//! - [`stored_json`]: a value written into a column of a real SQLite store where the store
//!   keeps JSON (or another decoded text), then read back through the store's API.
//!
//! The AFL harnesses in `fuzz/` (outside the workspace) call these functions; the test
//! `tests/corpus.rs` replays every file of `fuzz/corpus/<target>/` through them, so that
//! `cargo test` checks the corpora without AFL.

pub mod expr_target;
mod guard_target;
mod http_target;
mod stored_target;
mod toml_target;

pub use expr_target::request_expr;
pub use guard_target::guard;
pub use http_target::http_request;
pub use stored_target::stored_json;
pub use toml_target::machine_toml;

/// A fuzz target: a name (its corpus directory under `fuzz/corpus/`) and its function.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("machine_toml", machine_toml),
    ("guard", guard),
    ("request_expr", request_expr),
    ("http_request", http_request),
    ("stored_json", stored_json),
];

/// Drops what the target named `name` keeps between inputs (a server, a store) and the
/// temporary files under it: a replay of a corpus leaves nothing behind. The next input
/// builds them again.
pub fn release(name: &str) {
    match name {
        "http_request" => http_target::release(),
        "stored_json" => stored_target::release(),
        _ => {}
    }
}

/// The target named `name`.
pub fn target(name: &str) -> Option<fn(&[u8])> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}
