#!/usr/bin/env bash
# Starts a local control plane on loopback (the API server also on $HOST_IP, for pods on a real
# node, hack/node-up.sh): etcd, kube-apiserver (RBAC on, admission webhooks
# possible), kube-controller-manager (garbage collection, namespaces, service accounts, Jobs,
# StatefulSets, volume binding) and kube-scheduler.
# Already running: does nothing. A stale PID file is cleaned up. Writes a kubeconfig and
# prints its path on the last line.
#
#   hack/cluster-up.sh                  # KUBECONFIG=$(hack/cluster-up.sh | tail -1)
#   hack/cluster-down.sh                # stops it
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

BIN=$("$here/build-control-plane.sh" | tail -1)
ETCD="$BIN/etcd-$CUSTODY_ETCD_VERSION"
APISERVER="$BIN/kube-apiserver-$CUSTODY_KUBE_VERSION"
KCM="$BIN/kube-controller-manager-$CUSTODY_KUBE_VERSION"
SCHEDULER="$BIN/kube-scheduler-$CUSTODY_KUBE_VERSION"
mkdir -p "$CLUSTER_DIR"
exec 9>"$CLUSTER_DIR/.lock"
hold_lock 9 "the control plane's start"

# The control plane is started over when this script (its flags) changed since it started.
started_by="$CLUSTER_DIR/started-by"
this_script=$(sha256sum "$0" | cut -d' ' -f1)
if running etcd && running kube-apiserver && running kube-controller-manager \
  && running kube-scheduler && [[ "$(cat "$started_by" 2>/dev/null)" == "$this_script" ]]; then
  # Running: a busy API server may answer slowly; it is not started over for that.
  for _ in $(seq 60); do
    if healthy; then
      log "control plane already running (API server https://127.0.0.1:$APISERVER_PORT)"
      echo "$KUBECONFIG_PATH"
      exit 0
    fi
    sleep 1
  done
  log "control plane running but not healthy for 60 s: starting over"
fi
# Something is missing or stale: start over from a clean state.
stop_all
rm -rf "$CLUSTER_DIR/etcd" "$CLUSTER_DIR/logs"
mkdir -p "$CLUSTER_DIR/pki" "$CLUSTER_DIR/logs" "$CLUSTER_DIR/etcd"

generate_certificates() {
  local pki="$CLUSTER_DIR/pki"
  if [[ -s "$pki/admin.crt" && -s "$pki/apiserver.crt" && -s "$pki/sa.key" ]] \
    && openssl x509 -in "$pki/apiserver.crt" -noout -text | grep -q "IP Address:$HOST_IP\b"; then
    return
  fi
  log "generating certificates in $pki"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=custody-local-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    cat > apiserver.ext <<EXT
subjectAltName=IP:127.0.0.1,IP:$HOST_IP,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
extendedKeyUsage=serverAuth
EXT
    openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    echo "extendedKeyUsage=clientAuth" > client.ext
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=custody-admin" -keyout admin.key -out admin.csr 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile client.ext -out admin.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ./*.ext
  )
}

write_kubeconfig() {
  local pki="$CLUSTER_DIR/pki"
  cat > "$KUBECONFIG_PATH" <<KC
apiVersion: v1
kind: Config
clusters:
- name: custody-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $(base64 -w0 < "$pki/ca.crt")
users:
- name: custody-admin
  user:
    client-certificate-data: $(base64 -w0 < "$pki/admin.crt")
    client-key-data: $(base64 -w0 < "$pki/admin.key")
contexts:
- name: custody-local
  context: {cluster: custody-local, user: custody-admin, namespace: default}
current-context: custody-local
KC
}

# The host's address pods reach the API server at (through the kubernetes Service) and a real
# node's kubelet, DNS and agents listen on: an address of its own on the loopback device.
ip -4 addr show dev lo | grep -q "inet $HOST_IP/32" || ip addr add "$HOST_IP/32" dev lo
generate_certificates
write_kubeconfig
pki="$CLUSTER_DIR/pki"

start etcd "$ETCD" \
  --name=custody-local --data-dir="$CLUSTER_DIR/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="custody-local=http://127.0.0.1:$ETCD_PEER_PORT" \
  --listen-metrics-urls="http://127.0.0.1:$ETCD_METRICS_PORT" \
  --quota-backend-bytes=4294967296 --unsafe-no-fsync=true --log-level=warn
wait_for etcd curl -fsS "http://127.0.0.1:$ETCD_METRICS_PORT/health"

start kube-apiserver "$APISERVER" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=0.0.0.0 --advertise-address="$HOST_IP" --secure-port="$APISERVER_PORT" \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" \
  --kubelet-client-certificate="$pki/admin.crt" --kubelet-client-key="$pki/admin.key" \
  --kubelet-preferred-address-types=InternalIP,Hostname \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc \
  --api-audiences=https://kubernetes.default.svc \
  --authorization-mode=RBAC --anonymous-auth=false \
  --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true \
  --enable-admission-plugins=NamespaceLifecycle,ServiceAccount,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy \
  --profiling=false -v=1
wait_for kube-apiserver healthy

start kube-controller-manager "$KCM" \
  --kubeconfig="$KUBECONFIG_PATH" \
  --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
  --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
  --leader-elect=false --use-service-account-credentials=false \
  --controllers='*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller' \
  --profiling=false -v=1
wait_for kube-controller-manager curl -fsSk "https://127.0.0.1:$KCM_PORT/healthz"
wait_for kube-controller-manager kubectl_local -n default get serviceaccount default

# Places StatefulSet pods on the test nodes (local PersistentVolumes' node affinity included).
start kube-scheduler "$SCHEDULER" \
  --kubeconfig="$KUBECONFIG_PATH" \
  --authentication-kubeconfig="$KUBECONFIG_PATH" --authorization-kubeconfig="$KUBECONFIG_PATH" \
  --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" \
  --leader-elect=false --profiling=false -v=1
wait_for kube-scheduler curl -fsSk "https://127.0.0.1:$SCHEDULER_PORT/healthz"

echo "$this_script" > "$started_by"
log "control plane up: API server https://127.0.0.1:$APISERVER_PORT, kubeconfig $KUBECONFIG_PATH"
echo "$KUBECONFIG_PATH"
