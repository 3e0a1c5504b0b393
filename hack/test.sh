#!/usr/bin/env bash
# custody's test suite: installs what it needs, builds and starts the local control plane
# (etcd + kube-apiserver + kube-controller-manager, cached after the first build), builds
# custody's binaries and runs every test against them. Ends with one summary line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
hack/prerequisites.sh
hack/cluster-up.sh >/dev/null
cargo build --workspace --bins --locked
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked --no-fail-fast --lib --bins --tests "$@" 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "custody: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
