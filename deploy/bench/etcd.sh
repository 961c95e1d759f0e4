#!/usr/bin/env bash
# Baseline for Tessera's commit benchmark: the put rate, put latency and leader failover time of
# a 3-member etcd 3.4 cluster on this machine. Debian 12, as root. Installs what is missing
# (etcd-server, etcd-client, python3) with apt-get, then:
#
#  1. Starts 3 etcd members as separate processes on 127.0.0.1 (distinct client and peer ports,
#     chosen free, 23790 and up; never 2379/2380, where Debian's own etcd.service may listen),
#     each with its own data dir under one `mktemp -d` directory. etcd's defaults are kept:
#     fsync on every commit, heartbeat 100 ms, election timeout 1000 ms. A trap stops the
#     members and removes the directory on any exit (success, error, Ctrl-C).
#
#  2. Put rate (--clients, --duration-s). What is measured: C clients (default 64), each with
#     its own keep-alive HTTP/1.1 connection, spread round-robin over the 3 members, each doing
#     back-to-back puts (one outstanding put per client; a new unique key "bench/<client>/<n>",
#     a --value-bytes value, default 256 bytes) for D seconds (default 20). Puts that followers
#     receive are forwarded to the leader, as in etcd's own `benchmark put` over all endpoints.
#     put_per_s = successful puts / elapsed; p50/p90/p99/max = client-side latency of each put
#     (request sent to response read), nearest rank over all puts of the run.
#     The client is a small Python (standard library only) asyncio program that speaks to etcd's
#     gRPC-JSON gateway (POST /v3/kv/put on the client port, enabled by default in 3.4): a gRPC
#     client needs packages outside the standard library, and running `etcdctl put` in parallel
#     loops measures process start-up (~25 ms per put on a 2-core VM), not etcd. Limits: the
#     gateway adds JSON/HTTP decoding and an in-process gRPC hop inside etcd, so these figures
#     are below what a native gRPC client gets (on the 2-core VM where this was written:
#     1,000 clients, 1 KiB values, 2,680 puts/s through the gateway against 3,180/s for
#     `check perf --load=xl`, also 1,000 clients, native gRPC: about 15% lower); the load
#     generator and the 3 members share this machine's cores (the generator itself uses about
#     0.2 of a core at ~2,000 puts/s); all members share one disk, so every commit is 3 fsyncs
#     on the same device; the key space only grows (no overwrites, no compaction).
#
#     Optional cross-check, --check-perf LOAD (s, m, l or xl): also runs `etcdctl check perf`,
#     etcd's own Go gRPC load. It does NOT honour --clients or --duration-s: each level has a
#     fixed client count, a fixed rate cap and always runs 60 s (s: 50 clients, 150 puts/s;
#     m: 200, 1,000/s; l: 500, 8,000/s; xl: 1,000, 15,000/s), writes 256-byte keys with 1 KiB
#     values, and reports only throughput, the slowest request and the standard deviation (no
#     percentiles). Its throughput is a capacity figure only when the cap is above what the
#     cluster does (xl on small machines); otherwise it is the cap. Reported under "check_perf".
#
#  3. Leader failover, on the idle cluster after the load: finds the leader with
#     `etcdctl endpoint status -w json`, starts the prober (so that its start-up is not timed),
#     takes t0 = `date +%s%N`, `kill -9`s the leader, and probes the two survivors with puts
#     until one succeeds. A put sent before the survivors notice the loss is forwarded to the
#     dead leader and is not answered until etcd gives up on it (seconds), even if a new leader
#     exists by then, so a single serial poller would only see the recovery at its per-request
#     timeout. Instead a new probe (own connection, alternating between the survivors, 2 s
#     timeout) starts every --probe-interval-ms (default 10) on a fixed schedule;
#     failover_ms = completion time of the first successful probe - t0 (what a client that
#     retries every 10 ms would see). Resolution: the probe interval plus one put's latency.
#     Bounded at 30 s. Expect roughly 1,000-2,000 ms, more after a split vote: etcd's
#     randomized election timeout is 1-2 x 1000 ms, so one kill is one noisy sample.
#     --failover-rounds N repeats it (restarting the killed member and waiting for health in
#     between) and reports the median as failover_ms, every run in failover_runs_ms.
#
# Output: progress on stderr; one JSON object on stdout, e.g.
#   {"system":"etcd","version":"3.4.23","members":3,"clients":64,"duration_s":20,
#    "value_bytes":256,"put_per_s":2250.1,"puts":45000,"errors":0,"p50_ms":26.4,"p90_ms":...,
#    "p99_ms":70.2,"max_ms":...,"mean_ms":...,"failover_ms":1075.3,"failover_runs_ms":[1075.3],
#    ...,"check_perf":null}
# Figures a run does not produce are null.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: deploy/bench/etcd.sh [options]

Measures a local 3-member etcd 3.4 cluster (fsync on): put rate and latency under concurrent
clients, then leader failover time. Progress goes to stderr, one JSON object to stdout.
Runs as root on Debian 12; installs etcd-server, etcd-client and python3 if missing.

Options:
  --duration-s N          seconds of put load (default 20)
  --clients N             concurrent clients, one outstanding put each (default 64, max 1000)
  --value-bytes N         value size of each put (default 256)
  --check-perf LOAD       also run `etcdctl check perf --load=LOAD` (s|m|l|xl; fixed 60 s,
                          fixed clients and rate cap per level; default: not run)
  --probe-interval-ms N   failover probe spacing in ms (default 10)
  --failover-rounds N     leader kills (default 1); the killed member is restarted between
                          rounds; failover_ms is the median, failover_runs_ms lists them all
  --base-port N           first port to try; the cluster takes 6 consecutive ports
                          (default 23790; further candidates are tried if busy)
  --dir DIR               parent directory for the temporary data dirs (default: $TMPDIR or
                          /tmp); fsync cost depends on this file system
  --json                  accepted and ignored (the JSON object is always printed)
  -h, --help              this text
EOF
}

log() { printf 'etcd-bench: %s\n' "$*" >&2; }
die() { printf 'etcd-bench: error: %s\n' "$*" >&2; exit 1; }

# check_range NAME VALUE MIN MAX: VALUE must be a decimal integer in MIN..MAX.
check_range() {
    if ! [[ "$2" =~ ^[0-9]{1,9}$ ]] || [ "$2" -lt "$3" ] || [ "$2" -gt "$4" ]; then
        die "$1 must be an integer in $3..$4, got '$2'"
    fi
}

duration_s=20
clients=64
value_bytes=256
check_perf_load=""
probe_interval_ms=10
failover_rounds=1
base_port=23790
parent_dir="${TMPDIR:-/tmp}"

while [ "$#" -gt 0 ]; do
    case "$1" in
        --duration-s | --clients | --value-bytes | --check-perf | --probe-interval-ms | --failover-rounds | --base-port | --dir)
            [ "$#" -ge 2 ] || die "$1 needs a value (see --help)"
            case "$1" in
                --duration-s) duration_s="$2" ;;
                --clients) clients="$2" ;;
                --value-bytes) value_bytes="$2" ;;
                --check-perf) check_perf_load="$2" ;;
                --probe-interval-ms) probe_interval_ms="$2" ;;
                --failover-rounds) failover_rounds="$2" ;;
                --base-port) base_port="$2" ;;
                --dir) parent_dir="$2" ;;
            esac
            shift 2
            ;;
        --duration-s=* | --clients=* | --value-bytes=* | --check-perf=* | --probe-interval-ms=* | --failover-rounds=* | --base-port=* | --dir=*)
            opt="${1%%=*}"
            val="${1#*=}"
            shift
            set -- "$opt" "$val" "$@"
            ;;
        --json) shift ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

check_range "--duration-s" "$duration_s" 1 3600
check_range "--clients" "$clients" 1 1000
check_range "--value-bytes" "$value_bytes" 1 1048576
check_range "--probe-interval-ms" "$probe_interval_ms" 1 1000
check_range "--failover-rounds" "$failover_rounds" 1 50
check_range "--base-port" "$base_port" 1024 65000
case "$check_perf_load" in
    "" | s | m | l | xl) ;;
    *) die "--check-perf must be one of s, m, l, xl, got '$check_perf_load'" ;;
esac
[ -d "$parent_dir" ] || die "--dir '$parent_dir' is not a directory"

[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages with apt-get)"

# One socket per client in the load generator, and a third of them in each member.
need_fds=$((clients + 256))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need_fds" ]; then
    ulimit -S -n "$need_fds" 2>/dev/null ||
        die "open-file limit $(ulimit -n) is too low for $clients clients and cannot be raised to $need_fds"
fi

# --- dependencies ------------------------------------------------------------------------------
missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
for tool in timeout mktemp date stat; do
    command -v "$tool" >/dev/null 2>&1 || missing+=(coreutils)
done
if [ "${#missing[@]}" -gt 0 ]; then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    log "installing ${missing[*]}"
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install ${missing[*]} by hand"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
        die "apt-get install ${missing[*]} failed"
fi
for tool in etcd etcdctl python3; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool still missing after installation"
done
python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 7) else 1)' ||
    die "python3 >= 3.7 is needed (asyncio.run)"

etcd_version="$(etcd --version 2>/dev/null | sed -n 's/^etcd Version: *//p' | head -n 1)"
[ -n "$etcd_version" ] || die "could not read the version from 'etcd --version'"
case "$etcd_version" in
    3.4.*) ;;
    *) log "warning: etcd $etcd_version is not 3.4.x; the figures may not compare with 3.4" ;;
esac

# Settings inherited from the environment (e.g. /etc/default/etcd sourced into this shell, or
# ETCDCTL_ENDPOINTS) would change the members or point etcdctl elsewhere: drop them.
while IFS= read -r var; do
    case "$var" in ETCD_* | ETCDCTL_*) unset "$var" ;; esac
done < <(compgen -e)
export ETCDCTL_API=3

# --- temporary directory, cleanup --------------------------------------------------------------
work="$(mktemp -d "$parent_dir/tessera-etcd-bench.XXXXXX")" || die "mktemp -d in '$parent_dir' failed"
pids=()
step_pid=""

member_alive() { # PID: running and not a zombie ("" is never alive)
    [[ "$1" =~ ^[0-9]+$ ]] && [ -r "/proc/$1/stat" ] &&
        [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

cleanup() {
    local rc=$? pid i alive
    trap - EXIT INT TERM
    if [ -n "$step_pid" ]; then
        kill -TERM "$step_pid" 2>/dev/null || true
    fi
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    # The last member standing, without quorum, takes seconds to stop; the data is thrown
    # away anyway, so after 2 s: KILL. At most 5 s in all.
    for ((i = 0; i < 50; i++)); do
        alive=0
        for pid in "${pids[@]}"; do
            if member_alive "$pid"; then
                alive=1
                [ "$i" -lt 20 ] || kill -KILL "$pid" 2>/dev/null || true
            fi
        done
        [ "$alive" -eq 1 ] || break
        sleep 0.1
    done
    [ "$alive" -eq 0 ] || log "warning: could not stop etcd pids ${pids[*]}"
    rm -rf -- "$work"
    exit "$rc"
}
trap cleanup EXIT
interrupted() {
    log "interrupted; stopping the cluster"
    exit 130
}
trap interrupted INT
trap 'log "terminated; stopping the cluster"; exit 143' TERM

data_fs="$(stat -f -c %T "$work" 2>/dev/null || echo unknown)"
case "$data_fs" in
    tmpfs | ramfs) log "warning: $work is on $data_fs: fsync costs nothing there; use --dir on a disk" ;;
esac

# --- the Python helper (standard library only) ---------------------------------------------------
helper="$work/helper.py"
cat >"$helper" <<'PYEOF'
"""Load generator, failover prober and JSON helpers for deploy/bench/etcd.sh."""
import asyncio
import base64
import json
import os
import signal
import sys
import time


def b64(data):
    return base64.b64encode(data).decode("ascii")


async def read_response(reader):
    """Reads one HTTP/1.1 response; returns (status, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, chunked = None, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return status, body
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    if length is None:
        raise RuntimeError("HTTP response without Content-Length")
    return status, await reader.readexactly(length)


def put_request(endpoint, key, value_b64):
    body = ('{"key":"%s","value":"%s"}' % (b64(key), value_b64)).encode("ascii")
    return (
        b"POST /v3/kv/put HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (endpoint.encode("ascii"), len(body))
    ) + body


def ok_put(status, body):
    return status == 200 and b'"error"' not in body and b'"header"' in body


async def load(endpoints, clients, duration_s, value_bytes):
    value_b64 = b64(os.urandom(value_bytes))
    latencies, errors, first_error = [], [0], [None]
    start = time.perf_counter()
    deadline = start + duration_s

    async def client(cid):
        endpoint = endpoints[cid % len(endpoints)]
        host, port = endpoint.rsplit(":", 1)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)
        seq = 0
        try:
            while True:
                t = time.perf_counter()
                if t >= deadline:
                    return
                writer.write(put_request(endpoint, b"bench/%d/%d" % (cid, seq), value_b64))
                seq += 1
                status, body = await asyncio.wait_for(read_response(reader), 30)
                if ok_put(status, body):
                    latencies.append(time.perf_counter() - t)
                else:
                    errors[0] += 1
                    if first_error[0] is None:
                        first_error[0] = "HTTP %d: %s" % (status, body[:200].decode("utf-8", "replace"))
        finally:
            writer.close()

    results = await asyncio.gather(*(client(i) for i in range(clients)), return_exceptions=True)
    elapsed = time.perf_counter() - start
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise SystemExit("load: %d of %d clients failed; first: %r" % (len(failed), clients, failed[0]))
    if first_error[0] is not None:
        print("etcd-bench: warning: %d puts failed; first: %s" % (errors[0], first_error[0]), file=sys.stderr)
    if not latencies:
        raise SystemExit("load: no put succeeded")
    latencies.sort()

    def pct(p):  # nearest rank
        rank = max(1, -(-len(latencies) * p // 100))
        return round(latencies[int(rank) - 1] * 1000, 2)

    return {
        "puts": len(latencies),
        "errors": errors[0],
        "elapsed_s": round(elapsed, 3),
        "put_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "max_ms": round(latencies[-1] * 1000, 2),
        "mean_ms": round(sum(latencies) / len(latencies) * 1000, 2),
    }


async def failover(endpoints, go_file, ready_file, interval_ms, limit_s):
    """Once go_file holds the kill time (ns, `date +%s%N`), starts a put probe every interval_ms;
    returns ms from the kill to the first success. Creates ready_file when it waits for go_file,
    so that the kill happens after Python's start-up, not before."""
    with open(ready_file, "w"):
        pass
    wait_until = time.monotonic() + 10
    while not os.path.exists(go_file):
        if time.monotonic() > wait_until:
            raise SystemExit("failover: %s did not appear within 10 s" % go_file)
        time.sleep(0.001)
    with open(go_file) as f:
        t_kill_ns = int(f.read().strip())
    done = asyncio.get_running_loop().create_future()
    value_b64 = b64(b"failover")
    attempts = [0]

    async def probe(n):
        endpoint = endpoints[n % len(endpoints)]
        host, port = endpoint.rsplit(":", 1)
        writer = None
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(put_request(endpoint, b"failover/%d" % n, value_b64))
            status, body = await read_response(reader)
            if ok_put(status, body) and not done.done():
                done.set_result((time.time_ns(), n, endpoint))
        except (OSError, asyncio.IncompleteReadError, ValueError, RuntimeError):
            pass
        finally:
            if writer is not None:
                writer.close()

    tasks = []
    start = time.monotonic()
    first_probe_ms = round((time.time_ns() - t_kill_ns) / 1e6, 1)
    if first_probe_ms > 500:
        print("etcd-bench: warning: the first failover probe started %.0f ms after the kill; "
              "failover_ms may be late" % first_probe_ms, file=sys.stderr)
    n = 0
    while not done.done() and time.monotonic() < start + limit_s:
        tasks.append(asyncio.ensure_future(asyncio.wait_for(probe(n), 2.0)))
        n += 1
        attempts[0] = n
        # Probe n starts at start + n * interval (a fixed schedule, so slow turns do not add up).
        pause = start + n * interval_ms / 1000 - time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(done), max(0.0, pause))
        except asyncio.TimeoutError:
            pass
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if not done.done():
        raise SystemExit("failover: no put succeeded within %d s of the kill (%d probes)" % (limit_s, n))
    t_ok, first_ok, endpoint = done.result()
    return {
        "failover_ms": round((t_ok - t_kill_ns) / 1e6, 1),
        "probes": attempts[0],
        "first_probe_ms": first_probe_ms,
        "first_ok_probe": first_ok,
        "endpoint": endpoint,
    }


def leader(status_json):
    """Reads `etcdctl endpoint status -w json`; prints the leader's endpoint (exact 64-bit ids)."""
    statuses = json.loads(status_json)
    leaders = {s["Status"]["leader"] for s in statuses}
    if len(statuses) < 2 or len(leaders) != 1 or 0 in leaders:
        raise SystemExit("leader: members disagree or have no leader: %s" % sorted(leaders))
    (lead,) = leaders
    for s in statuses:
        if s["Status"]["header"]["member_id"] == lead:
            return s["Endpoint"]
    raise SystemExit("leader: leader id %d is none of the queried endpoints" % lead)


def num(text):
    if text in ("", "null", None):
        return None
    return json.loads(text)


def main():
    # Ctrl-C ends the helper at once, without a traceback; the script's trap cleans up.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "load":
        eps, clients, duration_s, value_bytes = args[0].split(","), int(args[1]), float(args[2]), int(args[3])
        print(json.dumps(asyncio.run(load(eps, clients, duration_s, value_bytes))))
    elif cmd == "failover":
        eps, go_file, ready_file, interval, limit = args[0].split(","), args[1], args[2], int(args[3]), int(args[4])
        print(json.dumps(asyncio.run(failover(eps, go_file, ready_file, interval, limit))))
    elif cmd == "leader":
        print(leader(sys.stdin.read()))
    elif cmd == "median":  # median X...
        xs = sorted(float(x) for x in args)
        mid = len(xs) // 2
        print(round(xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2, 1))
    elif cmd == "get":  # get FIELD < json  -> a string field as is, others as JSON (null if absent)
        value = json.loads(sys.stdin.read()).get(args[0])
        print(value if isinstance(value, str) else json.dumps(value))
    elif cmd == "version":  # the server version reported by endpoint status
        versions = sorted({s["Status"]["version"] for s in json.loads(sys.stdin.read())})
        print(",".join(versions))
    elif cmd == "checkperf":  # checkperf LOAD RC < etcdctl output -> JSON object
        import re
        text = sys.stdin.read().replace("\r", "\n")
        caps = {"s": (50, 150), "m": (200, 1000), "l": (500, 8000), "xl": (1000, 15000)}
        def grab(pattern):
            m = re.search(pattern, text)
            return float(m.group(1)) if m else None
        tput = grab(r"Throughput (?:is|too low:) (\d+) writes/s")
        slowest = grab(r"Slowest request (?:took|took too long:) ([0-9.]+)s")
        stddev = grab(r"Stddev (?:is|too high:) ([0-9.]+)s")
        print(json.dumps({
            "load": args[0],
            "clients": caps[args[0]][0],
            "rate_cap_per_s": caps[args[0]][1],
            "duration_s": 60,
            "key_bytes": 256,
            "value_bytes": 1024,
            "put_per_s": tput,
            "slowest_ms": None if slowest is None else round(slowest * 1000, 1),
            "stddev_ms": None if stddev is None else round(stddev * 1000, 1),
            "pass": args[1] == "0",
        }))
    elif cmd == "emit":  # emit KEY=JSONVALUE ...  -> one JSON object
        out = {}
        for kv in args:
            k, _, v = kv.partition("=")
            out[k] = num(v)
        print(json.dumps(out))
    else:
        raise SystemExit("helper: unknown command %s" % cmd)


if __name__ == "__main__":
    main()
PYEOF
py() { python3 "$helper" "$@"; }

# --- ports ---------------------------------------------------------------------------------------
port_busy() { timeout --foreground 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

if port_busy 2379; then
    log "something (probably Debian's etcd.service) listens on 2379; leaving it alone"
fi
chosen=""
for ((try = 0; try < 20; try++)); do
    cand=$((base_port + try * 10))
    [ $((cand + 5)) -le 65535 ] || break
    free=1
    for ((p = cand; p < cand + 6; p++)); do
        if port_busy "$p"; then
            free=0
            break
        fi
    done
    if [ "$free" -eq 1 ]; then
        chosen="$cand"
        break
    fi
done
[ -n "$chosen" ] || die "no 6 consecutive free ports found from $base_port (20 candidates tried); use --base-port"

names=(m0 m1 m2)
client_ports=("$chosen" $((chosen + 2)) $((chosen + 4)))
peer_ports=($((chosen + 1)) $((chosen + 3)) $((chosen + 5)))
initial_cluster=""
endpoints=()
for i in 0 1 2; do
    initial_cluster+="${initial_cluster:+,}${names[$i]}=http://127.0.0.1:${peer_ports[$i]}"
    endpoints+=("127.0.0.1:${client_ports[$i]}")
done
all_eps="$(IFS=,; echo "${endpoints[*]}")"

# --- start the cluster -----------------------------------------------------------------------
log "etcd $etcd_version; 3 members on 127.0.0.1 ports $chosen-$((chosen + 5)); data in $work ($data_fs)"
# start_member I: starts member I in the background (again, after the failover kill: with its
# data dir in place, etcd ignores the --initial-cluster* flags and rejoins).
start_member() {
    local i="$1"
    etcd \
        --name "${names[$i]}" \
        --data-dir "$work/${names[$i]}.etcd" \
        --listen-client-urls "http://127.0.0.1:${client_ports[$i]}" \
        --advertise-client-urls "http://127.0.0.1:${client_ports[$i]}" \
        --listen-peer-urls "http://127.0.0.1:${peer_ports[$i]}" \
        --initial-advertise-peer-urls "http://127.0.0.1:${peer_ports[$i]}" \
        --initial-cluster "$initial_cluster" \
        --initial-cluster-token "tessera-bench-$$" \
        --initial-cluster-state new \
        >>"$work/${names[$i]}.log" 2>&1 &
    pids[i]="$!"
    # Out of the job table: bash still reaps it, but prints no "Killed" line for the failover kill.
    disown "$!"
}
for i in 0 1 2; do
    start_member "$i"
done

show_logs() {
    local n
    for n in "${names[@]}"; do
        log "last lines of $n.log:"
        tail -n 5 "$work/$n.log" >&2 || true
    done
}

# wait_healthy LIMIT_S: polls `etcdctl endpoint health` on all members (at most 100 polls, and
# none started after LIMIT_S seconds); fails at once if a member process is gone.
wait_healthy() {
    local deadline=$((SECONDS + $1)) i j
    for ((i = 0; i < 100; i++)); do
        for j in 0 1 2; do
            if ! member_alive "${pids[$j]}"; then
                show_logs
                die "member ${names[$j]} (pid ${pids[$j]}) has exited"
            fi
        done
        if etcdctl --endpoints="$all_eps" --dial-timeout=500ms --command-timeout=1s \
            endpoint health >/dev/null 2>&1; then
            return 0
        fi
        [ "$SECONDS" -lt "$deadline" ] || break
        sleep 0.3
    done
    show_logs
    die "cluster not healthy after $((i + 1)) polls over about $1 s ($all_eps)"
}

wait_healthy 30
status_json="$(etcdctl --endpoints="$all_eps" --command-timeout=5s endpoint status -w json)" ||
    die "etcdctl endpoint status failed on $all_eps"
server_version="$(py version <<<"$status_json")"
log "cluster healthy (server version $server_version); leader $(py leader <<<"$status_json")"

# --- put load --------------------------------------------------------------------------------
log "put load: $clients clients, $duration_s s, $value_bytes-byte values, spread over 3 members"
# run_step OUT CMD...: runs CMD with stdout to OUT in the background and waits for it, so that
# a signal to this script runs its trap at once (bash defers traps until a foreground command
# ends); cleanup stops the step.
run_step() {
    start_step "$@"
    wait_step
}
start_step() { # OUT CMD...: the first half of run_step
    local out="$1"
    shift
    "$@" >"$out" &
    step_pid=$!
}
wait_step() { # the second half: returns the step's exit status
    local rc=0
    wait "$step_pid" || rc=$?
    step_pid=""
    return "$rc"
}

# check_rc WHAT RC: stops the script when a step did not succeed, saying why.
check_rc() {
    case "$2" in
        0) ;;
        124) die "$1 did not finish in time" ;;
        130 | 143) interrupted ;;
        *) die "$1 failed (exit $2; see the messages above)" ;;
    esac
}
load_rc=0
run_step "$work/load.json" timeout --foreground $((duration_s + 120)) \
    python3 "$helper" load "$all_eps" "$clients" "$duration_s" "$value_bytes" || load_rc=$?
check_rc "the put load" "$load_rc"
load_json="$(cat "$work/load.json")"
field() { py get "$1" <<<"$load_json"; }
log "put load: $(field puts) puts in $(field elapsed_s) s = $(field put_per_s) puts/s;" \
    "p50 $(field p50_ms) ms, p99 $(field p99_ms) ms, max $(field max_ms) ms, errors $(field errors)"

# --- optional etcdctl check perf -------------------------------------------------------------
check_perf_json=null
if [ -n "$check_perf_load" ]; then
    log "etcdctl check perf --load=$check_perf_load (60 s, fixed clients and rate cap)"
    cp_rc=0
    run_step "$work/checkperf.out" timeout --foreground 300 \
        etcdctl --endpoints="$all_eps" check perf --load="$check_perf_load" 2>"$work/checkperf.err" || cp_rc=$?
    case "$cp_rc" in 124 | 130 | 143) check_rc "etcdctl check perf" "$cp_rc" ;; esac
    check_perf_json="$(py checkperf "$check_perf_load" "$cp_rc" <"$work/checkperf.out")"
    if [ "$(py get put_per_s <<<"$check_perf_json")" = null ]; then
        tail -n 5 "$work/checkperf.err" >&2 || true
        die "could not read a throughput from etcdctl check perf (exit $cp_rc)"
    fi
    log "check perf: $(tr '\r' '\n' <"$work/checkperf.out" | grep -E 'PASS|FAIL|took|Stddev' | paste -sd ' ' -)"
fi

# --- leader failover -------------------------------------------------------------------------
failover_runs=()
for ((round = 1; round <= failover_rounds; round++)); do
    if [ "$round" -gt 1 ]; then
        log "failover: restarting ${names[$leader_idx]} for round $round"
        start_member "$leader_idx"
    fi
    wait_healthy 30
    status_json="$(etcdctl --endpoints="$all_eps" --command-timeout=5s endpoint status -w json)" ||
        die "etcdctl endpoint status failed on $all_eps before failover round $round"
    leader_ep="$(py leader <<<"$status_json")" || die "could not determine the leader"
    leader_idx=""
    survivors=()
    for i in 0 1 2; do
        if [ "${endpoints[$i]}" = "$leader_ep" ]; then
            leader_idx="$i"
        else
            survivors+=("${endpoints[$i]}")
        fi
    done
    [ -n "$leader_idx" ] || die "leader endpoint $leader_ep is not one of ours"
    surv_eps="$(IFS=,; echo "${survivors[*]}")"
    log "failover $round/$failover_rounds: kill -9 leader ${names[$leader_idx]} ($leader_ep," \
        "pid ${pids[$leader_idx]}); probing $surv_eps every $probe_interval_ms ms"
    # The prober starts first and says when it is ready; then the kill, then t0 goes to it.
    rm -f "$work/fo.ready" "$work/fo.go"
    start_step "$work/failover.json" timeout --foreground 60 python3 "$helper" failover \
        "$surv_eps" "$work/fo.go" "$work/fo.ready" "$probe_interval_ms" 30
    for ((i = 0; i < 200; i++)); do
        [ ! -e "$work/fo.ready" ] || break
        member_alive "$step_pid" || break
        sleep 0.05
    done
    [ -e "$work/fo.ready" ] || die "the failover prober did not start (see the messages above)"
    t_kill="$(date +%s%N)"
    kill -KILL "${pids[$leader_idx]}"
    echo "$t_kill" >"$work/fo.go.tmp"
    mv "$work/fo.go.tmp" "$work/fo.go"
    fo_rc=0
    wait_step || fo_rc=$?
    check_rc "the failover probe (no put through a surviving member succeeded within 30 s of the kill?)" "$fo_rc"
    failover_out="$(cat "$work/failover.json")"
    # SIGKILL is immediate and bash reaps the member; forget its pid so cleanup cannot hit a reuse.
    member_alive "${pids[$leader_idx]}" || pids[leader_idx]=""
    failover_runs+=("$(py get failover_ms <<<"$failover_out")")
    new_status="$(etcdctl --endpoints="$surv_eps" --command-timeout=2s endpoint status -w json 2>/dev/null || true)"
    new_leader="$( (py leader <<<"$new_status") 2>/dev/null || echo unknown)"
    log "failover $round/$failover_rounds: first put acknowledged ${failover_runs[-1]} ms after the kill" \
        "(probes from $(py get first_probe_ms <<<"$failover_out") ms; probe" \
        "$(py get first_ok_probe <<<"$failover_out") of $(py get probes <<<"$failover_out"), via" \
        "$(py get endpoint <<<"$failover_out")); new leader $new_leader"
done
failover_ms="$(py median "${failover_runs[@]}")"
failover_runs_json="[$(IFS=,; echo "${failover_runs[*]}")]"
[ "$failover_rounds" -eq 1 ] || log "failover: median $failover_ms ms over $failover_rounds rounds"

# --- result --------------------------------------------------------------------------------
py emit \
    system='"etcd"' \
    version="\"$server_version\"" \
    members=3 \
    clients="$clients" \
    duration_s="$duration_s" \
    value_bytes="$value_bytes" \
    put_per_s="$(field put_per_s)" \
    puts="$(field puts)" \
    errors="$(field errors)" \
    p50_ms="$(field p50_ms)" \
    p90_ms="$(field p90_ms)" \
    p99_ms="$(field p99_ms)" \
    max_ms="$(field max_ms)" \
    mean_ms="$(field mean_ms)" \
    failover_ms="$failover_ms" \
    failover_runs_ms="$failover_runs_json" \
    failover_probe_interval_ms="$probe_interval_ms" \
    election_timeout_ms=1000 \
    heartbeat_ms=100 \
    fsync=true \
    data_fs="\"$data_fs\"" \
    client='"python asyncio over the gRPC-JSON gateway"' \
    check_perf="$check_perf_json"
log "done; stopping the cluster"
