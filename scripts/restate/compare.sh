#!/usr/bin/env bash
# Settle against Restate on this machine, side by side (issue "hot path"): alternates a
# `settle bench` workflow with Restate's twin of it (service.mjs: a virtual object per
# workflow whose steps are journaled `ctx.run`s, driven through Restate's ingress by
# drive.mjs with the same number of calls in flight), ROUNDS times each, and prints every
# run, the medians and their ratio.
#
#   scripts/restate/compare.sh                    # bench chain: 20000 workflows, 3 steps, 64 in flight, 3 rounds
#   BENCH=fanout scripts/restate/compare.sh       # bench fanout (4 children a parent) against the fan-out twin
#   BENCH=agents scripts/restate/compare.sh       # bench agents (a settle serve and 4 agent loops over HTTP)
#                                                 # against the chain twin, as the issue compares them
#   WORKFLOWS=5000 CONCURRENCY=32 ROUNDS=5 scripts/restate/compare.sh
#   SETTLE_DB=postgres://postgres@127.0.0.1:5432/test scripts/restate/compare.sh
#                                                 # Settle on PostgreSQL (a fresh schema a run)
#   SETTLE_ARGS="--instances 1" SETTLE_DB=postgres://… scripts/restate/compare.sh
#   SETTLE_BIN=/tmp/settle-before scripts/restate/compare.sh
#                                                 # a given build of settle (no cargo build): to
#                                                 # compare two builds against Restate in turn
#
# Needs Node.js and npm (the Restate server and SDK are npm packages, installed here into
# node_modules on first use, versions pinned in package.json); builds Settle in release unless SETTLE_BIN names a binary.
# Restate runs with its default configuration (its logs and RocksDB write-ahead logs are
# fsynced), on a fresh data directory, on the default ports 8080 (ingress), 9070 (admin)
# and 5122; the service listens on 9080.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
WORKFLOWS="${WORKFLOWS:-20000}"
STEPS="${STEPS:-3}"
CONCURRENCY="${CONCURRENCY:-64}"
ROUNDS="${ROUNDS:-3}"
CHILDREN="${CHILDREN:-4}"
BENCH="${BENCH:-chain}"
case "$BENCH" in
  chain) bench=(chain --steps "$STEPS"); object=chain ;;
  fanout) bench=(fanout --children "$CHILDREN"); object=fanparent ;;
  agents) bench=(agents); object=chain ;;
  *) echo "compare.sh: BENCH is chain, fanout or agents, not \`$BENCH'" >&2; exit 2 ;;
esac
command -v node >/dev/null || { echo "compare.sh: needs Node.js (node, npm)" >&2; exit 2; }
if [ ! -x "$here/node_modules/.bin/restate-server" ]; then
  echo "installing the Restate server and SDK (npm, once)…" >&2
  (cd "$here" && npm install --no-audit --no-fund --loglevel=error >&2)
fi
if [ -n "${SETTLE_BIN:-}" ]; then
  settle="$SETTLE_BIN"
else
  cargo build --release --quiet -p settle-cli
  settle="$PWD/target/release/settle"
fi

scratch="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$scratch"
}
trap cleanup EXIT

echo "starting Restate (data in $scratch)…" >&2
(cd "$scratch" && exec "$here/node_modules/.bin/restate-server" --no-logo --base-dir "$scratch/restate" \
  > "$scratch/restate.log" 2>&1) &
pids+=($!)
RESTATE_LOGGING=WARN STEPS="$STEPS" CHILDREN="$CHILDREN" node "$here/service.mjs" > "$scratch/service.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
  curl -sf http://127.0.0.1:9070/health >/dev/null 2>&1 && break
  sleep 0.5
done
curl -sf http://127.0.0.1:9070/health >/dev/null || { cat "$scratch/restate.log" >&2; echo "Restate did not start" >&2; exit 1; }
registered=""
for _ in $(seq 1 60); do
  curl -sf -X POST http://127.0.0.1:9070/deployments -H 'content-type: application/json' \
    -d '{"uri": "http://127.0.0.1:9080"}' >/dev/null 2>&1 && registered=1 && break
  sleep 0.5
done
[ -n "$registered" ] || { cat "$scratch/service.log" >&2; echo "Restate did not take the service on :9080" >&2; exit 1; }
# A warm-up run of Restate's twin, not counted (each Settle run starts on a fresh database).
WORKFLOWS=500 CONCURRENCY="$CONCURRENCY" OBJECT="$object" node "$here/drive.mjs" >/dev/null

pg_schema() { # a fresh schema for one Settle run on PostgreSQL
  local s="cmp_$RANDOM$RANDOM"
  psql -q "${SETTLE_DB}" -c "CREATE SCHEMA $s" >/dev/null
  echo "$s"
}
settle_run() {
  local db=() schema=""
  if [[ "${SETTLE_DB:-}" == postgres* ]]; then
    schema="$(pg_schema)"
    db=(--db "${SETTLE_DB}?schema=$schema")
  fi
  # shellcheck disable=SC2086
  "$settle" "${db[@]}" bench "${bench[@]}" --entities "$WORKFLOWS" --concurrency "$CONCURRENCY" \
    ${SETTLE_ARGS:-} --json 2>/dev/null | tail -1
  if [ -n "$schema" ]; then psql -q "${SETTLE_DB}" -c "DROP SCHEMA $schema CASCADE" >/dev/null 2>&1; fi
}
: > "$scratch/runs"
for r in $(seq 1 "$ROUNDS"); do
  s="$(settle_run)"
  [ -n "$s" ] || { echo "settle bench ${bench[*]} printed no report (run it alone to see why)" >&2; exit 1; }
  echo "settle  $s" | tee -a "$scratch/runs"
  t="$(WORKFLOWS="$WORKFLOWS" CONCURRENCY="$CONCURRENCY" OBJECT="$object" node "$here/drive.mjs")"; echo "restate $t" | tee -a "$scratch/runs"
done
python3 - "$scratch/runs" <<'PY'
import json, statistics, sys
runs = {"settle": [], "restate": []}
for line in open(sys.argv[1]):
    who, js = line.split(" ", 1)
    runs[who].append(json.loads(js))
med = {w: {k: statistics.median(r[k] for r in rs) for k in ("workflows_per_s", "p50_ms", "p99_ms")} for w, rs in runs.items()}
for w, m in med.items():
    print(f"{w:8s} medians of {len(runs[w])}: {m['workflows_per_s']:,.0f} workflows/s, p50 {m['p50_ms']:.1f} ms, p99 {m['p99_ms']:.1f} ms")
print(f"ratio (settle / restate, workflows/s): {med['settle']['workflows_per_s'] / med['restate']['workflows_per_s']:.2f}")
PY
