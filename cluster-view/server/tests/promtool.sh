#!/usr/bin/env bash
# The Prometheus expositions (`GET /metrics`) of a replica and of the agents and scheduler hosts
# checked by promtool (Debian's prometheus package): format, HELP and TYPE lines, naming
# conventions. The target is `tessera dev` on free loopback ports, after the example jobs have
# run, so that the per-state, per-level and latency series carry values; their figures are then
# checked against the jobs the API shows (deploy/grafana/figures.py), and the Grafana dashboard
# (deploy/grafana/tessera.json) against the same expositions (deploy/grafana/check.py). Exits
# non-zero on any complaint.
set -euo pipefail
cd "$(dirname "$0")/../../.."
. deploy/install-deps.sh
set +u
if ! command -v promtool >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus
fi

. cluster-view/server/tests/dev-cluster.sh
start_dev --submit examples/jobs/*.toml

# While the jobs hold GPUs, the per-tenant allocation series exist: one scrape then (bounded:
# 120 s), checked with the others below.
for _ in $(seq 1 480); do
    api /metrics >"$work/running.txt" 2>/dev/null && grep -q '^tessera_gpus_allocated{' "$work/running.txt" && break
    sleep 0.25
done
grep -q '^tessera_gpus_allocated{' "$work/running.txt" || { echo "promtool check: no GPU was ever held" >&2; exit 1; }

# Every example job ended (bounded: 120 s), as the dev cluster's status tells.
all_ended() {
    local s
    s=$(api /v1/status 2>/dev/null) || return 1
    python3 -c '
import json, sys
c = json.loads(sys.argv[1])["jobs"]
sys.exit(0 if sum(c.values()) > 0 and all(c[k] == 0 for k in ("pending", "placed", "running", "migrating")) else 1)
' "$s"
}
for _ in $(seq 1 240); do
    all_ended && break
    sleep 0.5
done
all_ended || { echo "promtool check: the example jobs did not end within 120 s" >&2; exit 1; }
# The HTTP API runs on replica 1; the others' metrics are the same exposition code, so one
# replica's, after real work, is what is checked. (Each replica serves its own /metrics where
# `http_listen` is set, as in deploy/local.)
api /metrics >"$work/metrics.txt"
# The agents' and hosts' endpoint (one for all of them in tessera dev), with the same client
# certificate (a scraper needs none; curl offers it).
curl -fsS --cacert "$tls/ca.pem" "https://127.0.0.1:$metrics_port/metrics" >"$work/components.txt"
for f in running metrics components; do
    promtool check metrics <"$work/$f.txt"
    echo "promtool ($f): $(grep -c '^# TYPE' "$work/$f.txt") metric families, $(grep -vc '^#\|^$' "$work/$f.txt") series, no complaint"
done
api "/v1/jobs" >"$work/jobs.json"
python3 deploy/grafana/figures.py "$work/jobs.json" "$work/metrics.txt" "$work/components.txt"
# The Grafana dashboard in deploy/grafana: its queries parse and name only metrics exposed here.
cat "$work/running.txt" "$work/metrics.txt" "$work/components.txt" >"$work/all.txt"
python3 deploy/grafana/check.py deploy/grafana/tessera.json "$work/all.txt"
