#!/usr/bin/env bash
# Installs what building Tessera needs and this machine lacks. Debian 12, as root.
# Idempotent: installs nothing when everything is present. Sourced by dev.sh and test.sh.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: cargo not found; install the Rust toolchain first (https://rustup.rs)" >&2
    exit 1
fi

# System packages: a C and C++ toolchain for build scripts and linking, libclang for RocksDB's
# bindings (bindgen), hwloc for the node agent's host topology (linked: the hwloc2 crate needs
# the library and its pkg-config file). protoc comes from the protoc-bin-vendored crate.
missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
dpkg -s libclang-dev >/dev/null 2>&1 || missing+=(libclang-dev)
dpkg -s libhwloc-dev >/dev/null 2>&1 || missing+=(libhwloc-dev)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v sccache >/dev/null 2>&1 || missing+=(sccache)
command -v git >/dev/null 2>&1 || missing+=(git)
# systemd-analyze checks the units of deploy/systemd in the tests (offline: no systemd needs to run).
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
# libfaketime steps the wall clock of replica processes in the clock-fault tests
# (cli/tests/clock.rs, the chaos suite's clock-jump fault).
dpkg -s libfaketime >/dev/null 2>&1 || missing+=(libfaketime)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Toolchain components the test suite uses for its lint step.
if command -v rustup >/dev/null 2>&1; then
    cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
    cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
fi

# sccache caches compiled Rust and, through the cc crate, RocksDB's C++: without it every
# profile (check, test, release) recompiles RocksDB for about 15 minutes on 2 cores.
if command -v sccache >/dev/null 2>&1 && [ -z "${RUSTC_WRAPPER:-}" ]; then
    export RUSTC_WRAPPER=sccache
fi

# One build directory shared by every clone on this machine, so a fresh clone (CI) reuses
# earlier builds. Override with CARGO_TARGET_DIR.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tessera/target}"
mkdir -p "$CARGO_TARGET_DIR"
