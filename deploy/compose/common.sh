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

set +u
need_compose
set -u
