#!/usr/bin/env bash
# custody's test suite: installs what it needs, builds and starts the local control plane
# (etcd + kube-apiserver + kube-controller-manager, cached after the first build), builds
# custody's binaries and runs every test against them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
hack/prerequisites.sh
hack/cluster-up.sh >/dev/null
cargo build --workspace --bins --locked
cargo test --workspace --locked --no-fail-fast "$@"
