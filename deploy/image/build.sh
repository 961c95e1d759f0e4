#!/usr/bin/env bash
# Builds the `tessera` container image offline: FROM scratch, holding the release binary
# (debug info stripped), the shared libraries it links (found by ldd, copied at their paths)
# and a non-root user. Every role runs from it: `view serve`, `agent run`, `scheduler run`, the
# CLI. No registry is needed. Usage: deploy/image/build.sh [TAG] (default tessera:dev); prints
# the image's size.
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/install-deps.sh
tag="${1:-tessera:dev}"
command -v docker >/dev/null 2>&1 || { echo "build.sh: docker not found" >&2; exit 1; }
command -v objcopy >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq binutils; }

cargo build --release --locked -p tessera
bin="$CARGO_TARGET_DIR/release/tessera"

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
install -d "$root/usr/local/bin" "$root/etc/tessera" "$root/tmp" "$ctx/state/tessera"
objcopy --strip-debug "$bin" "$root/usr/local/bin/tessera"
# The libraries the binary links, transitively, and the dynamic loader, at the same paths.
# (NVML is loaded at run time by the agent when present: the NVIDIA container runtime mounts
# it into GPU containers; fake-GPU agents need none.)
for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
    install -d "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
# A user and group for the processes (uid 65532, as distroless images use), name lookups from
# /etc/hosts first, then DNS (compose and Kubernetes service names).
printf 'root:x:0:0:root:/root:/nonexistent\ntessera:x:65532:65532:tessera:/var/lib/tessera:/nonexistent\n' >"$root/etc/passwd"
printf 'root:x:0:\ntessera:x:65532:\n' >"$root/etc/group"
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
chmod 1777 "$root/tmp"
cp deploy/image/Dockerfile "$ctx/Dockerfile"

docker build --quiet --tag "$tag" "$ctx" >/dev/null
size=$(docker image inspect --format '{{.Size}}' "$tag")
echo "built $tag: $((size / 1024 / 1024)) MiB ($size bytes)"
