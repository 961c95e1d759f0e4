#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build, and run the main job.
#
# Today the main job places the example jobs in deploy/jobs/ on the example cluster
# deploy/clusters/dev.toml through the real placement search and approver, and prints each
# decision and the resulting GPU bitmaps. (`tessera dev`, a whole local cluster with replicated
# view, agents and HTTP API in one process, arrives with issue 5 and will replace this line.)
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/install-deps.sh
cargo build --release -p tessera
bin="$CARGO_TARGET_DIR/release/tessera"
"$bin" check cluster deploy/clusters/dev.toml
echo
"$bin" place --cluster deploy/clusters/dev.toml deploy/jobs/*.toml
echo
echo "Next: try '$bin place --cluster deploy/clusters/mixed.toml deploy/jobs/*.toml',"
echo "      or '$bin bench placement' (16,000 servers, 100,000 jobs)."
