#!/usr/bin/env bash
# Starts a real local node for the control plane of hack/cluster-up.sh: Debian's containerd and
# runc, CNI bridge networking, kubelet and kube-proxy built from source (hack/build-node.sh),
# and CoreDNS for *.svc names. Images are never pulled: the pause image is built here, and
# custody's images are imported by hack/build-images.sh.
# Idempotent: parts already running are left alone. hack/node-down.sh stops it.
#
#   hack/node-up.sh            # prints the node's name on its last line
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

[[ $(id -u) -eq 0 ]] || { log "a real node needs root (containerd, mounts, iptables)"; exit 1; }
install_missing containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins \
  buildah:buildah iptables:iptables musl-gcc:musl-tools conntrack:conntrack

"$here/cluster-up.sh" >/dev/null
BIN=$("$here/build-node.sh" | tail -1)
KUBELET="$BIN/kubelet-$CUSTODY_KUBE_VERSION"
KUBE_PROXY="$BIN/kube-proxy-$CUSTODY_KUBE_VERSION"
COREDNS="$BIN/coredns-$CUSTODY_COREDNS_VERSION"
mkdir -p "$NODE_DIR" "$NODE_RUN" "$NODE_DIR/cni" /var/lib/kubelet
# fd 9: the daemons started below do not inherit it (lib.sh start closes it).
exec 9>"$NODE_DIR/.lock"
hold_lock 9 "the node's start"

# containerd: its own root, state and socket; CRI with the local pause image, CNI, cgroupfs.
# restrict_oom_score_adj: this machine's root lacks CAP_SYS_RESOURCE, and runc cannot set the
# sandbox's oom_score_adj of -998 below containerd's own ("can't get final child's PID from
# pipe: EOF").
cat > "$NODE_DIR/containerd.toml" <<TOML
version = 2
root = "$NODE_DIR/containerd"
state = "$NODE_RUN/containerd"
[grpc]
  address = "$NODE_RUN/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_DIR/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
TOML
cat > "$NODE_DIR/cni/10-custody.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "custody", "plugins": [
  {"type": "bridge", "bridge": "custody0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$NODE_DIR/ipam",
            "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
if ! running containerd; then
  start containerd containerd --config "$NODE_DIR/containerd.toml"
  wait_for containerd ctr --address "$NODE_RUN/containerd.sock" version
  # Its CRI server answers "server is not initialized yet" until the plugin has started (it
  # logs "Start streaming server" just before): a kubelet started earlier exits at once
  # ("validate CRI v1 runtime API … not initialized yet", seen in CI).
  wait_for containerd grep -q "Start streaming server" "$CLUSTER_DIR/logs/containerd.log"
  sleep 0.2
fi
ctr_k8s() { ctr --address "$NODE_RUN/containerd.sock" -n k8s.io "$@"; }

# The pause image, built here (FROM scratch, one static binary).
if ! ctr_k8s images ls -q | grep -qx "$PAUSE_IMAGE"; then
  log "building $PAUSE_IMAGE"
  work=$(mktemp -d)
  musl-gcc -static -Os -o "$work/pause" "$here/node/pause.c"
  strip "$work/pause"
  export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
  container=$(buildah from scratch)
  buildah copy "$container" "$work/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535 "$container"
  buildah commit -q "$container" "$PAUSE_IMAGE" >/dev/null
  buildah rm "$container" >/dev/null
  buildah push -q "$PAUSE_IMAGE" "oci-archive:$work/pause.tar:$PAUSE_IMAGE"
  ctr_k8s images import "$work/pause.tar" >/dev/null
  rm -rf "$work"
fi

# kubelet: cgroup v1 (hybrid) accepted, cgroupfs, no QoS cgroups or allocatable enforcement
# (this machine's root cgroup is not its own); clients authenticated by the cluster's CA.
pki="$CLUSTER_DIR/pki"
cat > "$NODE_DIR/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: unix://$NODE_RUN/containerd.sock
address: $HOST_IP
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
clusterDNS: [$HOST_IP]
clusterDomain: cluster.local
resolvConf: $NODE_DIR/resolv.conf
serializeImagePulls: false
# Test volumes and images fill this machine's disk more than a node's: never evict for it.
evictionHard: {memory.available: "100Mi", nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
YAML
# Pods resolve only cluster names (there is no upstream DNS here).
echo "nameserver $HOST_IP" > "$NODE_DIR/resolv.conf"
# A kubelet whose Node is gone (the control plane started over with an empty etcd) is started
# again, so that it registers, and so are the node's other clients of the old API server.
if running kubelet && ! kubectl_local get node "$NODE_NAME" >/dev/null 2>&1; then
  log "the API server has no Node $NODE_NAME: restarting the kubelet, kube-proxy and CoreDNS"
  stop kubelet
  stop kube-proxy
  stop coredns
fi
if ! running kubelet; then
  start kubelet "$KUBELET" --config="$NODE_DIR/kubelet.yaml" --kubeconfig="$KUBECONFIG_PATH" \
    --hostname-override="$NODE_NAME" --node-ip="$HOST_IP" --root-dir=/var/lib/kubelet \
    --cert-dir="$NODE_DIR/kubelet-pki" -v=1
fi

# kube-proxy: iptables; every Service connection masqueraded, so a pod reaching a Service
# backed by a pod on the same bridge gets its answer back through the host.
cat > "$NODE_DIR/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KUBECONFIG_PATH}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
mode: iptables
iptables: {masqueradeAll: true}
conntrack: {maxPerCore: 0}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
YAML
if ! running kube-proxy; then
  start kube-proxy "$KUBE_PROXY" --config="$NODE_DIR/kube-proxy.yaml" -v=1
fi

# Cluster DNS on the host address: the kubernetes plugin answers *.svc.cluster.local.
cat > "$NODE_DIR/Corefile" <<COREFILE
.:53 {
    bind $HOST_IP
    errors
    health 127.0.0.1:18080
    ready 127.0.0.1:18181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KUBECONFIG_PATH custody-local
        pods insecure
    }
    cache 5
}
COREFILE
if ! running coredns; then
  start coredns "$COREDNS" -conf "$NODE_DIR/Corefile"
fi
wait_for coredns curl -fsS http://127.0.0.1:18181/ready
wait_for kubelet kubectl_local wait --for=condition=Ready "node/$NODE_NAME" --timeout=5s
# The control plane runs no node lifecycle controller (the tests' fake nodes do not heartbeat):
# the not-ready taint a new node is registered with is lifted here, once the kubelet is Ready.
kubectl_local taint node "$NODE_NAME" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
log "node $NODE_NAME ready (containerd $(containerd --version | awk '{print $3}'), pods $POD_CIDR, DNS $HOST_IP)"
echo "$NODE_NAME"
