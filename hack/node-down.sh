#!/usr/bin/env bash
# Stops the real local node of hack/node-up.sh: CoreDNS, kube-proxy, kubelet, every container
# it ran, containerd. --purge also removes its state (containerd's images and snapshots, the
# kubelet's directory after unmounting what is mounted under it, the bridge, kube-proxy's rules).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

stop coredns
stop kube-proxy
stop kubelet
if running containerd; then
  ctr_k8s() { ctr --address "$NODE_RUN/containerd.sock" -n k8s.io "$@"; }
  for task in $(ctr_k8s tasks ls -q 2>/dev/null); do
    ctr_k8s tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
  done
  sleep 1
  for task in $(ctr_k8s tasks ls -q 2>/dev/null); do
    ctr_k8s tasks delete -f "$task" >/dev/null 2>&1 || true
  done
fi
stop containerd
# Shims outlive containerd by design; the node's are stopped with it.
pkill -f "containerd-shim-runc-v2 .*-address $NODE_RUN/containerd.sock" 2>/dev/null || true
if [[ "${1:-}" == "--purge" ]]; then
  "$CUSTODY_CACHE/bin/kube-proxy-$CUSTODY_KUBE_VERSION" --cleanup >/dev/null 2>&1 || true
  # Deepest first, the kubelet's own bind mount of its root directory last.
  grep -E " (/var/lib/kubelet|$NODE_DIR|$NODE_RUN)[/ ]" /proc/self/mounts | awk '{print $2}' | sort -r \
    | while read -r target; do umount -l "$target" 2>/dev/null || true; done
  ip link delete custody0 2>/dev/null || true
  rm -rf "$NODE_DIR" "$NODE_RUN" /var/lib/kubelet
  log "removed the node's state"
fi
