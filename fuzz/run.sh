#!/usr/bin/env bash
# Fuzzes what Tessera reads from outside with cargo fuzz (libFuzzer), on the stable toolchain.
#
#   fuzz/run.sh [--seconds N] [--keep] [TARGET...]
#
# Runs each target (all five by default: wire_commands wire_snapshot spec_files trace_csv
# raft_messages) for N seconds (default 60), starting from the corpus kept in
# fuzz/corpus/TARGET; new inputs go to a scratch directory, and with --keep the ones that add
# edges are merged into the kept corpus (libFuzzer -set_cover_merge=1 -use_counters=0). Prints one JSON line per target
# ({target, seconds, runs, runs_per_s, coverage, features, corpus, crashes}) and exits 1 if any
# target crashed, panicked, ran out of memory or took over 10 s on one input; the input is
# saved under $CARGO_TARGET_DIR/fuzz/artifacts/TARGET. Reproduce with
# `cargo test -p tessera-testkit --test fuzz_corpus` after copying it into fuzz/corpus/TARGET.
#
# Builds without a sanitizer (the workspace forbids unsafe code; cargo fuzz's address
# sanitizer needs a nightly compiler) and with debug assertions, so an arithmetic overflow is
# a finding too.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=../deploy/install-deps.sh
source deploy/install-deps.sh

seconds=60
keep=0
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds="$2"; shift 2 ;;
        --keep) keep=1; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        -*) echo "fuzz/run.sh: unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done
[ "${#targets[@]}" -gt 0 ] || targets=(wire_commands wire_snapshot spec_files trace_csv raft_messages)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz/run.sh: installing cargo-fuzz"
    cargo install cargo-fuzz --locked --version 0.13.2
fi

dir="$CARGO_TARGET_DIR/fuzz"
flags=(-s none --debug-assertions --target-dir "$dir")
(cd fuzz && cargo fuzz build "${flags[@]}")

root=$PWD
failed=0
for t in "${targets[@]}"; do
    kept="$root/fuzz/corpus/$t"
    artifacts="$dir/artifacts/$t"
    mkdir -p "$kept" "$dir/scratch" "$artifacts"
    # A scratch corpus of this run's own, so that runs side by side do not share one.
    scratch=$(mktemp -d "$dir/scratch/$t.XXXXXX")
    log="$scratch.log"
    set +e
    (cd fuzz && cargo fuzz run "${flags[@]}" "$t" "$scratch" "$kept" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$artifacts/") >"$log" 2>&1
    rc=$?
    set -e
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
    crashes=0
    if [ "$rc" -ne 0 ]; then
        crashes=1
        failed=1
        echo "fuzz/run.sh: $t failed (exit $rc); the end of its log ($log):" >&2
        tail -40 "$log" >&2
    fi
    if [ "$keep" = 1 ] && [ "$rc" -eq 0 ]; then
        # A greedy set cover of the edges (not of hit counts): a corpus small enough to keep.
        (cd fuzz && cargo fuzz run "${flags[@]}" "$t" "$kept" "$scratch" -- -set_cover_merge=1 -use_counters=0) \
            >"$dir/$t.merge.log" 2>&1
    fi
    rm -rf "$scratch"
    corpus=$(find "$kept" -type f | wc -l)
    runs=${runs:-0}
    took=${took:-$seconds}
    echo "{\"target\":\"$t\",\"seconds\":$took,\"runs\":$runs,\"runs_per_s\":$(( runs / (took > 0 ? took : 1) )),\"coverage\":${cov:-0},\"features\":${ft:-0},\"corpus\":$corpus,\"crashes\":$crashes}"
done
exit "$failed"
