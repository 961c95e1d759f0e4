#!/usr/bin/env bash
# The chaos suite across containers (issue 14): builds the image, starts the compose cluster
# (3 replicas, each with its data on a loop-mounted file system of its own, 4 fake-GPU agents,
# 2 scheduler hosts), runs `tessera chaos run` against it — load through the scheduler hosts and
# direct gang proposals while a seeded schedule of faults is injected — and prints its JSON
# verdict. Exits non-zero on any violation; always removes its containers, networks, volumes
# and file systems.
#
#   deploy/chaos/run.sh                 # one round: 10 faults, one of each kind, and 3 partners
#                                       # injected during others (CI, < 5 min)
#   deploy/chaos/run.sh --soak          # 120 faults (12 of each kind) and 40 partners
#   TESSERA_CHAOS_SEED=7 deploy/chaos/run.sh   # another schedule; a failing seed repeats
#
# Extra arguments after `--` go to `tessera chaos run` (e.g. `-- --kinds kill-leader,full-disk`);
# TESSERA_CHAOS_FAULTS=N sets how many faults.
# TESSERA_CHAOS_LOGS=DIR keeps every container's whole log there.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/compose/common.sh
# The faults' tools: nsenter (util-linux), tc (iproute2), iptables, mkfs.ext4 (e2fsprogs),
# libfaketime (mounted into the replicas' containers).
missing=()
for t in nsenter:util-linux tc:iproute2 iptables:iptables mkfs.ext4:e2fsprogs; do
    command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t#*:}")
done
export TESSERA_FAKETIME_LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
[ -e "$TESSERA_FAKETIME_LIB" ] || missing+=(libfaketime)
if [ "${#missing[@]}" -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

faults=10
if [ "${1:-}" = "--soak" ]; then
    faults=120
    shift
fi
[ "${1:-}" = "--" ] && shift
seed="${TESSERA_CHAOS_SEED:-1}"
faults="${TESSERA_CHAOS_FAULTS:-$faults}"

project="tessera-chaos-$$"
# Host ports of this run: below the ephemeral range and free now (common.sh), away from the
# compose test's 271x/280x.
pick_host_ports 2910 3008
view="127.0.0.1:${TESSERA_PORT_PREFIX}1,127.0.0.1:${TESSERA_PORT_PREFIX}2,127.0.0.1:${TESSERA_PORT_PREFIX}3"
compose=(docker-compose -f deploy/compose/compose.yaml -f deploy/chaos/compose.chaos.yaml -p "$project")
work=$(mktemp -d)
export TESSERA_CHAOS_DATA="$work"
cleanup() {
    status=$?
    [ "$status" -ne 0 ] && dump_logs "chaos run" "${compose[@]}"
    if [ -n "${TESSERA_CHAOS_LOGS:-}" ]; then
        mkdir -p "$TESSERA_CHAOS_LOGS"
        for c in $("${compose[@]}" ps -q 2>/dev/null); do
            docker logs "$c" >"$TESSERA_CHAOS_LOGS/$(docker inspect --format '{{.Name}}' "$c" | tr -d /).log" 2>&1 || true
        done
    fi
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
    for i in 1 2 3; do mountpoint -q "$work/view-$i" && umount "$work/view-$i"; done
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

# Each replica's data on a 256 MiB ext4 file system of its own (no reserved blocks: the disk is
# full for the replica when it is full), owned by the image's user.
data_root=(--data-root "$work")
for i in 1 2 3; do
    mkdir -p "$work/view-$i"
    truncate -s 256M "$work/view-$i.img"
    mkfs.ext4 -q -F -m 0 "$work/view-$i.img"
    if ! mount -o loop "$work/view-$i.img" "$work/view-$i" 2>"$work/mount.err"; then
        echo "chaos: cannot loop-mount a file system ($(cat "$work/mount.err")): replicas keep their data on" \
            "the host's disk and the schedule has no full-disk faults" >&2
        data_root=()
        break
    fi
    chown 65532:65532 "$work/view-$i"
done
# Each replica's clock offset (read by libfaketime in its container; the suite rewrites it).
for i in 1 2 3; do
    mkdir -p "$work/clock/view-$i"
    echo "+0" >"$work/clock/view-$i/offset"
done

bash deploy/image/build.sh tessera:dev
tessera="$CARGO_TARGET_DIR/release/tessera"
# Mutual TLS everywhere: a CA and each container's certificate; the suite is the admin.
bash deploy/compose/certs.sh "$work/tls" "$tessera" >/dev/null
export TESSERA_TLS_DIR="$work/tls" TESSERA_TLS="$work/tls/admin"
t0=$(date +%s.%N)
"${compose[@]}" up -d
"$tessera" chaos run --project "$project" --view "$view" --seed "$seed" --faults "$faults" \
    --agent-lease-ms 6000 "${data_root[@]}" --clock-root "$work/clock" "$@" | tee "$work/report.json"
printf 'chaos run: seed %s, %s faults, %.0f s from compose up\n' "$seed" "$faults" "$(awk "BEGIN{print $(date +%s.%N) - $t0}")" >&2
