#!/usr/bin/env bash
# Starts, stops and shows a 3-replica Tessera view cluster on loopback: clients on ports
# 7101-7103, raft between the replicas on 7201-7203, the HTTP/JSON API on 8081-8083.
#
#   deploy/local/cluster.sh start     build tessera if needed, start the replicas, wait for a leader
#   deploy/local/cluster.sh status    role, term and applied index of each replica
#   deploy/local/cluster.sh stop      SIGTERM each replica, SIGKILL after 5 s
#   deploy/local/cluster.sh clean     stop, then delete the data and logs (deploy/local/run)
#
# Data, logs and pid files live in deploy/local/run/, the cluster CA and the certificates in
# deploy/local/run/tls/ (every connection is mutual TLS). TESSERA_BIN picks the binary (default:
# build the workspace's `tessera` with cargo). Clients: TESSERA_VIEW=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
# and TESSERA_TLS=deploy/local/run/tls/admin (an admin's certificate).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
run="$here/run"
view="127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"

tessera_bin() {
    if [ -n "${TESSERA_BIN:-}" ]; then
        echo "$TESSERA_BIN"
        return
    fi
    # shellcheck source=../install-deps.sh
    . "$here/../install-deps.sh" >&2
    cargo build -q -p tessera --manifest-path "$here/../../Cargo.toml" >&2
    echo "$CARGO_TARGET_DIR/debug/tessera"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# The cluster CA (made once) and the replicas' and an admin's certificates.
certificates() {
    local bin="$1" tls="$run/tls"
    [ -f "$tls/ca/ca.key" ] || "$bin" tls init --ca "$tls/ca" >/dev/null
    for i in 1 2 3; do
        [ -f "$tls/replica-$i/cert.pem" ] ||
            "$bin" tls issue --ca "$tls/ca" --role replica --name "replica-$i" --host 127.0.0.1 --host localhost \
                --out "$tls/replica-$i" >/dev/null
    done
    [ -f "$tls/admin/cert.pem" ] ||
        "$bin" tls issue --ca "$tls/ca" --role admin --name admin --out "$tls/admin" >/dev/null
}

start() {
    local bin
    bin="$(tessera_bin)"
    mkdir -p "$run"
    certificates "$bin"
    export TESSERA_TLS="$run/tls/admin"
    for i in 1 2 3; do
        if alive "$run/replica-$i.pid"; then
            echo "replica $i already runs (pid $(cat "$run/replica-$i.pid"))"
            continue
        fi
        RUST_LOG="${RUST_LOG:-info}" nohup "$bin" view serve --config "$here/replica-$i.toml" \
            >>"$run/replica-$i.log" 2>&1 </dev/null &
        echo $! >"$run/replica-$i.pid"
        echo "replica $i started (pid $!, log $run/replica-$i.log)"
    done
    for _ in $(seq 1 100); do
        # A leader, and every replica answering.
        if "$bin" view status --view "$view" --json 2>/dev/null | grep -q '"role":"leader"' &&
            ! "$bin" view status --view "$view" --json 2>/dev/null | grep -q '"error"'; then
            "$bin" view status --view "$view"
            echo "export TESSERA_VIEW=$view TESSERA_TLS=$run/tls/admin"
            echo "HTTP API: https://127.0.0.1:8081/v1/status (also :8082, :8083; GET /v1/openapi.json lists the routes;"
            echo "  curl --cacert $run/tls/admin/ca.pem --cert $run/tls/admin/cert.pem --key $run/tls/admin/key.pem ...)"
            return 0
        fi
        sleep 0.2
    done
    echo "no leader, or a replica not answering, after 20 s; see $run/replica-*.log" >&2
    return 1
}

stop() {
    # SIGTERM every replica first, then wait for each (a replica stops within about 1 s).
    for i in 1 2 3; do
        if alive "$run/replica-$i.pid"; then
            kill -TERM "$(cat "$run/replica-$i.pid")"
        fi
    done
    for i in 1 2 3; do
        local pidf="$run/replica-$i.pid"
        if alive "$pidf"; then
            local pid
            pid="$(cat "$pidf")"
            for _ in $(seq 1 50); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            if kill -0 "$pid" 2>/dev/null; then
                kill -KILL "$pid"
                echo "replica $i did not stop in 5 s: killed"
            else
                echo "replica $i stopped"
            fi
        fi
        rm -f "$pidf"
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) "$(tessera_bin)" view status --view "$view" --tls "$run/tls/admin" ;;
    clean)
        stop
        rm -rf "$run"
        ;;
    *)
        echo "usage: $0 start|status|stop|clean" >&2
        exit 2
        ;;
esac
