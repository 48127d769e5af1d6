#!/usr/bin/env bash
# The mutation harness (docs/simulation.md, "Mutants"): cargo-mutants over the modules
# whose bugs the simulation exists to catch, each mutant tested by the module's unit tests
# (and, for the store, the SQLite conformance suite) and 60 seeds of the simulation run in
# process (settle-sim's unit test), without the `settle` binary, so that a mutant rebuilds
# only the crates below the simulation.
#
#   scripts/mutants.sh                 # every group: pattern step task decide plan
#   scripts/mutants.sh pattern task    # some groups
#   SETTLE_SIM_SEEDS=200 scripts/mutants.sh decide   # more seeds a mutant
#   SETTLE_MUTANTS_ITERATE=1 scripts/mutants.sh decide   # only what the last run of the group
#                                    # did not catch (cargo-mutants --iterate), after adding tests
#   SETTLE_MUTANTS_TIMEOUT=30 scripts/mutants.sh plan    # seconds a mutant's tests may take
#                                    # (default 300; a mutant that loops costs all of it)
#   SETTLE_MUTANTS_RE='decide.rs:(261|296):' scripts/mutants.sh plan   # only the mutants whose
#                                    # name (file:line:col: change) matches (cargo-mutants --re),
#                                    # e.g. the survivors of a run, after the checks for them
#                                    # (cargo-mutants 27 keeps every "delete field" mutant of the
#                                    # group's files whatever the pattern: about 50 more for plan)
#
# Each package whose tests run is its own `--test-package` (cargo-mutants 27 reads
# `--test-package a,b` as one name and then tests only the mutated package).
#
# Time budget, on 2 cores: about 30 s a mutant (a rebuild of 5 to 25 s and the tests);
# pattern ~105 mutants (~50 min), step ~77 (~40 min), task (the agent task rules) ~60
# (~30 min), decide ~214 (~2 h), plan ~300 (~2.5 h): about 5 to 6 hours in all, so run it by group. Not part of CI.
#
# It works in a git worktree of HEAD (`target/mutants-tree`, its own target directory:
# the first run builds it), never in your working tree. The results of group G are in
# `target/mutants-out/G/mutants.out/` (caught.txt, missed.txt, timeout.txt,
# unviable.txt); a summary line per group is printed at the end.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tree="${SETTLE_MUTANTS_TREE:-$root/target/mutants-tree}"
out="${SETTLE_MUTANTS_OUT:-$root/target/mutants-out}"

if ! command -v cargo-mutants >/dev/null 2>&1; then
    echo "== installing cargo-mutants (crates.io)"
    cargo install cargo-mutants --locked
fi

head="$(git -C "$root" rev-parse HEAD)"
if [ -e "$tree/.git" ]; then
    git -C "$tree" checkout -q --detach "$head"
else
    git -C "$root" worktree add -q --detach "$tree" "$head"
fi

groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(pattern step task decide plan)
summary=()
for group in "${groups[@]}"; do
    skip=()
    case "$group" in
        pattern) files=(crates/core/src/pattern.rs); tests=(--test-package settle-core --test-package settle-sim -- --lib) ;;
        step) files=('crates/core/src/step/*.rs'); tests=(--test-package settle-core --test-package settle-sim -- --lib) ;;
        task) files=(crates/store/src/task.rs crates/store/src/plan/ops/task.rs); tests=(--test-package settle-store --test-package settle-sim -- --lib --test sqlite) ;;
        decide) files=('crates/engine/src/decide/*.rs'); tests=(--test-package settle-engine --test-package settle-sim -- --lib) ;;
        plan) files=('crates/store/src/plan/**/*.rs'); skip=(crates/store/src/plan/ops/task.rs); tests=(--test-package settle-store --test-package settle-sim -- --lib --test sqlite) ;;
        *) echo "unknown group \`$group\` (pattern, step, task, decide, plan)" >&2; exit 2 ;;
    esac
    args=()
    for f in "${files[@]}"; do args+=(-f "$f"); done
    for f in "${skip[@]}"; do args+=(-e "$f"); done
    echo "== mutants of $group (${files[*]})"
    mkdir -p "$out/$group"
    status=0
    [ -z "${SETTLE_MUTANTS_ITERATE:-}" ] || args+=(--iterate)
    [ -z "${SETTLE_MUTANTS_RE:-}" ] || args+=(--re "$SETTLE_MUTANTS_RE")
    (cd "$tree" && cargo mutants --in-place --no-shuffle --timeout "${SETTLE_MUTANTS_TIMEOUT:-300}" "${args[@]}" --output "$out/$group" "${tests[@]}") || status=$?
    dir="$out/$group/mutants.out"
    count() { if [ -s "$dir/$1.txt" ]; then grep -c . "$dir/$1.txt"; else echo 0; fi; }
    summary+=("$group: $(count caught) caught, $(count missed) missed, $(count timeout) timed out, $(count unviable) unviable (exit $status)")
done
printf '%s\n' "${summary[@]}"
