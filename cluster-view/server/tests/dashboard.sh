#!/usr/bin/env bash
# The web dashboard (GET /ui) in headless Chromium, Debian's chromium package, against
# `tessera dev` on free loopback ports (issue 16 §1): jobs submitted with the CLI, each page
# loaded by the browser and its DOM checked against the API's answers, a live page followed
# to a job's end, a screenshot of each page (under $TESSERA_SCREENSHOTS, default
# $CARGO_TARGET_DIR/dashboard). The checks are in dashboard.py beside this script. Exits
# non-zero on any mismatch.
set -euo pipefail
cd "$(dirname "$0")/../../.."
. deploy/install-deps.sh
set +u
if ! command -v chromium >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core
fi

. cluster-view/server/tests/dev-cluster.sh
start_dev
# `tessera dev` prints its banner (with the TESSERA_VIEW line) after its HTTP API answers
# /readyz, so the line may come a moment after start_dev returns: read the log until it does.
view=""
for _ in $(seq 1 120); do
    view=$(sed -n 's/.*export TESSERA_VIEW=\([^ ]*\).*/\1/p' "$work/dev.log" | head -n 1)
    [ -n "$view" ] && break
    sleep 0.5
done
[ -n "$view" ] || { echo "dashboard check: no TESSERA_VIEW line in the dev log within 60 s" >&2; exit 1; }
python3 cluster-view/server/tests/dashboard.py --port "$port" --tls "$tls" --ca "$work/data/tls/ca" \
    --tessera "$CARGO_TARGET_DIR/release/tessera" --view "$view" \
    --out "${TESSERA_SCREENSHOTS:-$CARGO_TARGET_DIR/dashboard}"
