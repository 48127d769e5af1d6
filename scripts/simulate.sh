#!/usr/bin/env bash
# Runs the deterministic simulation for as long as you like (default 1h), from a random seed,
# on an optimised build: `scripts/simulate.sh 8h`. Progress every 5 s on stderr; stops at the
# first seed that breaks an invariant, prints it with its trace and the command that replays
# it, and exits 1. A second argument runs it on PostgreSQL (`scripts/simulate.sh 1h
# postgres://postgres@127.0.0.1:5432/test`: a schema per seed). See docs/simulation.md.
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-1h}"
cargo build --release --quiet -p settle-cli
exec target/release/settle ${2:+--db "$2"} simulate --for "$duration"
