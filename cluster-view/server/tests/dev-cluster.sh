# Sourced by the scripts beside it that test the HTTP API of a live cluster (schemathesis.sh,
# promtool.sh), from the repository root after deploy/install-deps.sh.
#
# start_dev [ARGS...]: starts `tessera dev` (with ARGS) on free loopback ports, its HTTP API at
# https://127.0.0.1:$port (mutual TLS: $tls holds the dev cluster's admin certificate, `api PATH`
# GETs a route with it), its log and data under $work; stops it and removes $work on exit
# (printing the log's tail if the script failed); returns once the API is ready (a leader is
# known), failing after 60 s. The agents' and scheduler hosts' metrics are served at
# https://127.0.0.1:$metrics_port/metrics.
start_dev() {
    command -v curl >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq curl; }
    local tessera="$CARGO_TARGET_DIR/release/tessera"
    [ -x "$tessera" ] || cargo build --release --locked -p tessera
    port=$(free_port)
    metrics_port=$(free_port)
    work=$(mktemp -d)
    "$tessera" dev --view-port 0 --http-port "$port" --metrics-port "$metrics_port" --data-dir "$work/data" "$@" \
        >"$work/dev.log" 2>&1 &
    dev=$!
    trap stop_dev EXIT
    tls="$work/data/tls/admin-admin"
    for _ in $(seq 1 120); do
        [ -f "$tls/ca.pem" ] && api /readyz >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "tessera dev: no leader within 60 s" >&2
    return 1
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# GET https://127.0.0.1:$port$1 as the dev cluster's admin.
api() {
    curl -fsS --cacert "$tls/ca.pem" --cert "$tls/cert.pem" --key "$tls/key.pem" "https://127.0.0.1:$port$1"
}

stop_dev() {
    local status=$?
    kill "$dev" 2>/dev/null && wait "$dev" 2>/dev/null
    [ "$status" -ne 0 ] && tail -n 20 "$work/dev.log" >&2
    rm -rf "$work"
    exit "$status"
}
