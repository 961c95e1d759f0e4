#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, and run the main job: `tessera dev`, a
# whole cluster in one process (3 view replicas on RocksDB, 4 fake-GPU node agents in 2 racks,
# a scheduler host, the HTTP API), with the example jobs of examples/jobs/ submitted to it.
# Each job runs a real shell command that prints its rank, GPUs and CPU affinity.
#
# From a terminal the cluster stays up after the jobs end (Ctrl-C stops it) so you can try the
# CLI on it; without one (a script, CI) it stops once every job has ended. Extra arguments go
# to `tessera dev` (e.g. --servers 8, --topology dgx-h100, --exit-when-done).
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/install-deps.sh
cargo build --release --locked -p tessera
bin="$CARGO_TARGET_DIR/release/tessera"
args=(dev --submit examples/jobs/*.toml)
[ -t 0 ] || args+=(--exit-when-done)
echo "(the tessera binary: $bin)"
exec "$bin" "${args[@]}" "$@"
