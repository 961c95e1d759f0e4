#!/usr/bin/env bash
# The compose cluster's certificates (every connection is mutual TLS): a cluster CA and one
# TLS directory per container, named after its compose service (view-N, the agents, the
# scheduler hosts), plus `admin` for the CLI on the host.
#
#   deploy/compose/certs.sh DIR [TESSERA]     # TESSERA: the binary (default: tessera on PATH)
#
# The containers run as uid 65532 and read their directory read-only: the files are handed to
# that user. Keep DIR/ca/ca.key away from the cluster in a real deployment. docs/DEPLOY.md.
set -euo pipefail
dir="${1:?usage: certs.sh DIR [TESSERA]}"
tessera="${2:-tessera}"
mkdir -p "$dir"
[ -f "$dir/ca/ca.key" ] || "$tessera" tls init --ca "$dir/ca" >/dev/null
issue() { # out role name [host...]
    local out=$1 role=$2 name=$3
    shift 3
    local hosts=()
    for h in "$@"; do hosts+=(--host "$h"); done
    "$tessera" tls issue --ca "$dir/ca" --role "$role" --name "$name" "${hosts[@]}" --out "$dir/$out" >/dev/null
}
for i in 1 2 3; do
    issue "view-$i" replica "view-$i" "view-$i" "view-$i-raft" 127.0.0.1 localhost
done
for s in rack-a-s00 rack-a-s01 rack-b-s00 rack-b-s01; do
    issue "$s" agent "$s" "$s"
done
for h in scheduler-1 scheduler-2; do
    issue "$h" scheduler "$h"
done
issue admin admin admin
chown -R 65532:65532 "$dir"/view-* "$dir"/rack-* "$dir"/scheduler-*
echo "certificates for the compose cluster in $dir (CLI: export TESSERA_TLS=$dir/admin)"
