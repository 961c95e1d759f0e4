#!/usr/bin/env bash
# The compose cluster end to end, across containers: build the image, start 3 replicas, 4
# fake-GPU agents and 2 scheduler hosts (compose.yaml), run jobs submitted from this host (a
# 16-GPU gang over two servers of one rack and a 2-GPU job), kill -9 the leader's container,
# run another job through the new leader, restart the killed replica and check that every
# replica converges to one state; then cut the leader off the raft network and run a job, and
# restart the replicas one by one under load. Exits non-zero on any failure; always removes its containers,
# networks and volumes. Prints the cold-start and failover times.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/compose/common.sh

project="tessera-test-$$"
# Host ports of this run (overridable; otherwise free ones below the ephemeral range, common.sh).
pick_host_ports 2710 2808
view="127.0.0.1:${TESSERA_PORT_PREFIX}1,127.0.0.1:${TESSERA_PORT_PREFIX}2,127.0.0.1:${TESSERA_PORT_PREFIX}3"
compose=(docker-compose -f deploy/compose/compose.yaml -p "$project")
work=$(mktemp -d)
cleanup() {
    status=$?
    [ "$status" -ne 0 ] && dump_logs "compose test" "${compose[@]}"
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

bash deploy/image/build.sh tessera:dev
tessera="$CARGO_TARGET_DIR/release/tessera"
# Mutual TLS everywhere: a CA and each container's certificate; the CLI here is the admin.
bash deploy/compose/certs.sh "$work/tls" "$tessera" >/dev/null
export TESSERA_TLS_DIR="$work/tls" TESSERA_TLS="$work/tls/admin"

job() { # name gpus members [locality]
    printf 'name = "%s"\ngpus = %s\nmembers = %s\ncommand = ["/usr/local/bin/tessera", "--version"]\n%s' "$1" "$2" "$3" "${4:-}" \
        >"$work/$1.toml"
    echo "$work/$1.toml"
}
# Polls the replicas' status (into $s) every 0.5 s until predicate $1 holds on it; fails after
# 60 s saying that $2 did not happen.
until_status() {
    for _ in $(seq 1 120); do
        s=$("$tessera" view status --view "$view" --json 2>/dev/null || true)
        if "$1"; then return 0; fi
        sleep 0.5
    done
    echo "compose test: $2 within 60 s: $s" >&2
    return 1
}
count() { grep -o "$1" <<<"$s" | sort -u | wc -l; }
# Some replica knows a leader.
has_leader() { grep -q '"leader":[1-9]' <<<"$s"; }
# Every replica at one applied index and one state hash.
one_state() {
    [ "$(grep -o '"state_hash"' <<<"$s" | wc -l)" -eq 3 ] && [ "$(count '"state_hash":"[0-9a-f]*"')" -eq 1 ] &&
        [ "$(count '"applied_index":[0-9]*')" -eq 1 ]
}
# Every replica knows a leader and is within 10 entries of the others (while writes flow).
close_behind() {
    local spread
    spread=$(grep -o '"applied_index":[0-9]*' <<<"$s" | cut -d: -f2 | sort -n | sed -n '1p;$p' | paste -sd' ' - |
        awk '{ print ($2 == "" ? 0 : $2 - $1) }')
    [ "$(grep -o '"leader":[1-9][0-9]*' <<<"$s" | wc -l)" -eq 3 ] && [ "${spread:-99}" -le 10 ]
}
# The replica that leads now (after a bounded wait for an election).
leader() {
    until_status has_leader "no leader" || return 1
    grep -o '"leader":[1-9][0-9]*' <<<"$s" | head -n 1 | cut -d: -f2
}
# A replica other than $old leads (the cluster moved on from replica $old).
moved_on() { grep -o '"leader":[1-9][0-9]*' <<<"$s" | cut -d: -f2 | grep -qv "^$old\$"; }
converged() { until_status one_state "replicas did not converge"; }
caught_up() { until_status close_behind "replicas did not catch up"; }

t0=$(date +%s.%N)
"${compose[@]}" up -d
leader >/dev/null
timeout 120 "$tessera" submit --view "$view" --wait \
    "$(job gang-16 16 2 $'[locality]\nprefer = "rack"\ntolerate = "rack"\n')" "$(job small-2 2 1)"
t1=$(date +%s.%N)
converged

old=$(leader)
echo "== kill -9 the leader's container (view-$old), then run a job through the new leader"
docker kill --signal KILL "${project}_view-${old}_1" >/dev/null
t2=$(date +%s.%N)
until_status moved_on "no new leader after the kill"
timeout 120 "$tessera" submit --view "$view" --wait "$(job after-failover 8 1)"
t3=$(date +%s.%N)
new=$(leader)
[ "$new" != "$old" ] || { echo "compose test: replica $old still leads after its kill" >&2; exit 1; }
docker start "${project}_view-${old}_1" >/dev/null
converged
old=$(leader)
echo "== cut the leader (view-$old) off the raft network; a job runs through the new leader (agents that"
echo "   watched the cut-off replica must move to another), then the cut is healed"
docker network disconnect "${project}_raft" "${project}_view-${old}_1"
t6=$(date +%s.%N)
# The cut-off leader still answers clients until it steps down, and the CLI gives up after 5 s:
# the job is submitted once the others have elected a new leader (counted in the time).
until_status moved_on "no new leader after the partition"
timeout 120 "$tessera" submit --view "$view" --wait "$(job after-partition 4 1)"
t7=$(date +%s.%N)
docker network connect --alias "view-${old}-raft" "${project}_raft" "${project}_view-${old}_1"
converged

echo "== rolling restart under load: each replica restarted in turn (followers first, the leader last),"
echo "   the next only once all three have caught up, while jobs are submitted one after another and run"
(
    n=0
    while [ ! -e "$work/stop" ]; do
        n=$((n + 1))
        timeout 60 "$tessera" submit --view "$view" --wait "$(job rolling-$n $((n % 3 + 1)) 1)" >>"$work/rolling.log" 2>&1 || exit 1
    done
    echo "$n" >"$work/count"
) &
load=$!
t4=$(date +%s.%N)
lead=$(leader)
order=()
for id in 1 2 3; do [ "$id" = "$lead" ] || order+=("$id"); done
order+=("$lead")
for id in "${order[@]}"; do
    # SIGTERM, 10 s to stop cleanly; the other two keep the quorum meanwhile.
    docker restart --time 10 "${project}_view-${id}_1" >/dev/null
    caught_up
done
touch "$work/stop"
wait "$load" || { cat "$work/rolling.log" >&2; echo "compose test: a job failed during the rolling restart" >&2; exit 1; }
t5=$(date +%s.%N)
rolled=$(cat "$work/count")
converged
"$tessera" jobs --view "$view"
printf 'compose test passed: cold start to 2 jobs finished %.1f s; leader kill to a job finished %.1f s (new leader: replica %s); leader cut off the raft network to a job finished %.1f s; rolling restart of 3 replicas (order %s) in %.1f s with %s jobs submitted and finished meanwhile\n' \
    "$(awk "BEGIN{print $t1 - $t0}")" \
    "$(awk "BEGIN{print $t3 - $t2}")" "$new" "$(awk "BEGIN{print $t7 - $t6}")" "${order[*]}" "$(awk "BEGIN{print $t5 - $t4}")" "$rolled"
