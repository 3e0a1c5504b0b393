#!/usr/bin/env bash
# Stops the local control plane started by hack/cluster-up.sh, by PID. --purge also removes
# its state (etcd data, certificates, kubeconfig).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
stop_all
if [[ "${1:-}" == "--purge" ]]; then
  rm -rf "$CLUSTER_DIR"
  log "removed $CLUSTER_DIR"
fi
