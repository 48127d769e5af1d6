#!/usr/bin/env bash
# Runs AFL (through cargo-afl) on one fuzz target, or on all of them one after another.
#
#   fuzz/run.sh [TARGET|all] [SECONDS]     (defaults: all, 600)
#
# Targets: machine_toml guard request_expr http_request stored_json. Installs cargo-afl when missing,
# builds the harnesses, fuzzes each target for SECONDS (wall clock) from its corpus
# fuzz/corpus/TARGET into fuzz/out/TARGET (resumed if it exists), then prints the
# fuzzer's numbers from fuzz/out/TARGET/default/fuzzer_stats.
set -euo pipefail

cd "$(dirname "$0")"
TARGETS=(machine_toml guard request_expr http_request stored_json)
target=${1:-all}
seconds=${2:-600}

if ! cargo afl --version >/dev/null 2>&1; then
    cargo install cargo-afl
fi
# cargo-afl builds AFL++ when it is installed; `config --build` only when that did not happen.
if ! compgen -G "${XDG_DATA_HOME:-$HOME/.local/share}/afl.rs/rustc-*/afl.rs-*/afl/bin/afl-fuzz" >/dev/null; then
    cargo afl config --build
fi

if [[ $target == all ]]; then
    selected=("${TARGETS[@]}")
elif [[ " ${TARGETS[*]} " == *" $target "* ]]; then
    selected=("$target")
else
    echo "unknown target \`$target\` (one of: ${TARGETS[*]}, all)" >&2
    exit 2
fi

cargo afl build --release

export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_AFFINITY=1 AFL_AUTORESUME=1
export AFL_NO_UI=1 AFL_QUIET=1 AFL_SKIP_CRASHES=1
mkdir -p out
for t in "${selected[@]}"; do
    echo "== $t: ${seconds}s"
    # -t: per-input timeout (ms); the HTTP target may wait up to the server's 20 ms max_wait
    # and rebuilds its server every 20,000 requests.
    cargo afl fuzz -i "corpus/$t" -o "out/$t" -V "$seconds" -t 2000 -- "target/release/$t" >"out/$t.log" 2>&1 || {
        echo "afl-fuzz failed on $t; see fuzz/out/$t.log" >&2
        tail -20 "out/$t.log" >&2
        exit 1
    }
    # The targets' stores live in temporary directories that a killed harness leaves behind.
    rm -rf /dev/shm/settle-fuzz* 2>/dev/null || true
    stats="out/$t/default/fuzzer_stats"
    for key in execs_done execs_per_sec run_time corpus_count saved_crashes saved_hangs stability; do
        printf '%-14s %s\n' "$key" "$(awk -F' *: *' -v k="$key" '$1 == k {print $2}' "$stats")"
    done
    echo "crashes: out/$t/default/crashes/  hangs: out/$t/default/hangs/"
done
