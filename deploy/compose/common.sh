# Sourced, from the repository root, by the scripts that run the compose cluster
# (deploy/compose/test.sh, deploy/chaos/run.sh): the toolchain's environment, and
# docker-compose installed when it is missing.
. deploy/install-deps.sh

# Installs docker-compose (v1, Debian's package) when it is missing; fails without docker.
need_compose() {
    command -v docker >/dev/null 2>&1 || { echo "docker not found" >&2; return 1; }
    if ! command -v docker-compose >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose
    fi
}

# dump_logs WHAT COMPOSE-COMMAND...: the last lines of each of the project's containers' logs,
# to standard error, after WHAT failed.
dump_logs() {
    local what=$1
    shift
    echo "$what failed; the last lines of each container's log:" >&2
    for c in $("$@" ps -q 2>/dev/null); do
        echo "--- $(docker inspect --format '{{.Name}}' "$c")" >&2
        docker logs --tail 15 "$c" >&2 2>&1 || true
    done
}

# port_free PORT: no TCP socket on this host has PORT as its local port (listening or connected).
# Without `ss` (iproute2) every port counts as free.
port_free() {
    command -v ss >/dev/null 2>&1 || return 0
    [ -z "$(ss -Htan "( sport = :$1 )" 2>/dev/null)" ]
}

# pick_host_ports PORT-PREFIX HTTP-PREFIX: exports TESSERA_PORT_PREFIX and
# TESSERA_HTTP_PORT_PREFIX, the 4-digit prefixes of the replicas' host ports (prefix then 1, 2,
# 3; compose.yaml). A prefix already set in the environment is kept. Otherwise the first prefix
# from the given one up whose three ports are below the kernel's ephemeral range (where any
# outgoing connection may hold one: a CI run failed on 38082 taken that way) and held by no
# socket now.
pick_host_ports() {
    local low p
    low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    pick_one() {
        local p=$1
        while [ "$((p * 10 + 3))" -lt "$low" ]; do
            if port_free "${p}1" && port_free "${p}2" && port_free "${p}3"; then
                echo "$p"
                return 0
            fi
            p=$((p + 1))
        done
        echo "no free host ports from ${1}1 below the ephemeral range ($low)" >&2
        return 1
    }
    if [ -z "${TESSERA_PORT_PREFIX:-}" ]; then
        p=$(pick_one "$1") || return 1
        export TESSERA_PORT_PREFIX=$p
    fi
    if [ -z "${TESSERA_HTTP_PORT_PREFIX:-}" ]; then
        p=$(pick_one "$2") || return 1
        export TESSERA_HTTP_PORT_PREFIX=$p
    fi
}

set +u
need_compose
set -u
