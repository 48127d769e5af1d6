//! Helpers shared by the end-to-end tests: run the `settle` binary on a database file.
#![allow(dead_code)] // each test file uses its own subset

use std::path::Path;
use std::process::{Command, Output};

/// Runs `settle --db DB ARGS...` to completion, with logging quiet.
pub fn settle(db: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_settle"))
        .arg("--db")
        .arg(db)
        .args(args)
        .env("SETTLE_LOG", "error")
        .output()
        .expect("run settle")
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
