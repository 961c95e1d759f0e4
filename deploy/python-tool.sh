# Sourced by the scripts that run a tool from PyPI (deploy/k8s/validate.sh,
# cluster-view/server/tests/schemathesis.sh).
#
# python_tool NAME SPEC PROGRAM: installs SPEC (a pinned `package==version`) with pip into the
# virtual environment `tessera/venv-NAME` under the cache directory, once, installing python3
# and its venv module first where they are missing; sets $venv to it. PROGRAM is the executable
# the package installs in $venv/bin (its presence means the environment is complete).
python_tool() {
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv
    fi
    venv="${XDG_CACHE_HOME:-$HOME/.cache}/tessera/venv-$1"
    if [ ! -x "$venv/bin/$3" ]; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet "$2"
    fi
}
