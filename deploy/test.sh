#!/usr/bin/env bash
# Quick start, step 2: install what is missing and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/install-deps.sh
start=$(date +%s)

# The shared build directory is a cache. Incremental compilation only pays for edit-and-rebuild
# loops, and its directories take gigabytes: off here. When the disk under the build directory
# runs low, its fuzz and incremental builds go first, then the rest of it, so a full disk does
# not kill a linker halfway (a SIGBUS in `ld`, seen once on a CI machine).
export CARGO_INCREMENTAL=0
free_kib=$(df -Pk "$CARGO_TARGET_DIR" | awk 'NR == 2 { print $4 }')
echo "== $((free_kib / 1048576)) GiB free on the disk of $CARGO_TARGET_DIR"
# A full run adds up to 30 GiB to a cold build directory; RocksDB's C++ objects come back from
# sccache's own cache, so an emptied one costs the Rust compiles only.
need_kib=$((30 * 1048576))
if [ "${free_kib:-0}" -lt "$need_kib" ]; then
    echo "   under 30 GiB: removing its fuzz and incremental builds"
    rm -rf "$CARGO_TARGET_DIR/fuzz" "$CARGO_TARGET_DIR"/*/incremental
    free_kib=$(df -Pk "$CARGO_TARGET_DIR" | awk 'NR == 2 { print $4 }')
    if [ "${free_kib:-0}" -lt "$need_kib" ]; then
        echo "   still $((free_kib / 1048576)) GiB: emptying it"
        rm -rf "${CARGO_TARGET_DIR:?}"/*
    fi
fi

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== tests"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"

echo "== fail points at the replica's fsync, snapshot and apply boundaries (real RocksDB)"
cargo test -p tessera-replica --features failpoints --test failpoints --locked 2>&1 | tee -a "$log"

echo "== fuzz targets, short (cargo fuzz, libFuzzer, stable toolchain): 20 s each from the kept corpus"
echo "   (fuzz/corpus); exits non-zero on a panic, a crash, a hang or memory over 2 GiB"
bash fuzz/run.sh --seconds 20

echo "== benchmarks compile (criterion; run them with 'cargo bench')"
cargo bench -p tessera-view -p tessera-scheduler --locked --no-run

echo "== placement benchmark at full size (its own independent double-allocation check must pass)"
cargo build --release --locked -p tessera
"$CARGO_TARGET_DIR/release/tessera" bench placement --servers 16000 --gpus-per-server 8 --jobs 100000 --json

echo "== replicated commit path, short: 3 replica processes, kill -9 of the leader (exits non-zero on"
echo "   a lost acknowledged placement, a double allocation or diverging replicas)"
"$CARGO_TARGET_DIR/release/tessera" bench commit --local-cluster 3 --clients 16 --duration-s 6 \
    --servers 4096 --preload 512 --kill-leader-after-s 2 --json

echo "== node agent task path, short: one replica, 2 fake-GPU agents in one process, 40 jobs (exits"
echo "   non-zero on a failed job or an invariant violation)"
"$CARGO_TARGET_DIR/release/tessera" bench agent --servers 2 --jobs 40 --json

echo "== HTTP API against its OpenAPI document, property-based (schemathesis): generated valid and invalid"
echo "   requests to tessera dev; no server error, every answer as documented"
bash cluster-view/server/tests/schemathesis.sh

echo "== Prometheus exposition of /metrics checked by promtool, after tessera dev ran the example jobs;"
echo "   the Grafana dashboard's queries parse and name only exposed metrics"
bash cluster-view/server/tests/promtool.sh

echo "== web dashboard in headless Chromium against tessera dev: jobs from the CLI, each page's DOM against"
echo "   the API, a live page followed to a job's end, a screenshot per page"
bash cluster-view/server/tests/dashboard.sh

echo "== Kubernetes manifests (deploy/k8s), offline: strict schema validation and consistency"
bash deploy/k8s/validate.sh

echo "== the compose cluster across containers (deploy/compose/test.sh): image, 3 replicas, 4 fake-GPU"
echo "   agents, 2 scheduler hosts; jobs from this host, kill -9 of the leader's container, convergence"
bash deploy/compose/test.sh

echo "== chaos round across containers (deploy/chaos/run.sh): load through the scheduler hosts and direct"
echo "   proposals while 10 seeded faults, one of each kind (a clock jump among them), and 3 partner"
echo "   faults during others are injected; exits non-zero on a lost acknowledgement, a double"
echo "   allocation, diverging replicas, an unended job, a split brain or a view clock off true time"
bash deploy/chaos/run.sh

echo "== tessera dev, the quick start's main job: 3 replicas, 4 fake-GPU agents, a scheduler host;"
echo "   every example job submitted and run to its end (exits non-zero if one fails)"
"$CARGO_TARGET_DIR/release/tessera" dev --view-port 0 --http-port 0 --metrics-port 0 --submit examples/jobs/*.toml --exit-when-done

echo "== trace-driven simulator, short: the whole Philly trace under the four fast policies (exits"
echo "   non-zero on a malformed trace, an invariant violation or an unfinished job)"
"$CARGO_TARGET_DIR/release/tessera" sim --trace philly --policies fifo-firstfit,gandiva,hived,tessera-gpu-proportional-cpu --json > /dev/null

echo "== robustness matrix, quick: every policy on the 8-server cells (exits non-zero on an invariant"
echo "   violation, an unfinished job or a refused proposal; the targets it prints are tracked in docs/EVALUATION.md)"
"$CARGO_TARGET_DIR/release/tessera" sim --matrix --quick

echo "== all checks passed in $(( $(date +%s) - start )) s"
# One closing line with the totals over every test binary (cargo prints one line per binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, g }' "$log"
