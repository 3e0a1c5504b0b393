#!/usr/bin/env bash
# custody on a local embedded default: a real control plane on loopback (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler), a MinIO S3 server, custody's CRDs, its controller
# (reconcilers, admission webhook, agent reports) and two node agents on two "nodes". No
# kubelet can run here: tests/'s fake-kubelet plays only that part (it mounts loop-mounted
# ext4 volumes under each node's kubelet root, runs the real custody-mover and custody-wait
# binaries a pod names, and reports pod status).
#
# It backs up a database's volume, restores it into a new two-replica Cluster on both nodes
# (pods held by custody-wait until their node's agent verified the content), then shows a
# restore whose volume is damaged after the write being refused. Cleans up after itself; a
# second run works.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source hack/lib.sh

hack/prerequisites.sh
KUBECONFIG=$(hack/cluster-up.sh | tail -1)
export KUBECONFIG
kc() { echo "+ kubectl $*" >&2; kubectl_local "$@"; }
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
ns=custody-demo
node_a=custody-demo-a node_b=custody-demo-b
ip_a=127.0.10.1 ip_b=127.0.10.2
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

step "Installing custody's CRDs"
kc apply --server-side --force-conflicts --field-manager=custody-installer -f deploy/crds/ >/dev/null
# shellcheck disable=SC2046
kc wait --for=condition=Established --timeout=60s $(ls deploy/crds | sed 's/^/crd\//; s/\.yaml$//') >/dev/null
kc get crds | grep -E '^NAME|custody.io'

work=$(mktemp -d)
pids=()
mounts=()
cleanup() {
  set +e
  # Deleting the namespace needs the controller (finalizers) and the kubelet (pods) alive.
  kubectl_local delete namespace "$ns" --ignore-not-found --timeout=60s >/dev/null 2>&1
  kubectl_local delete mutatingwebhookconfiguration custody-demo --ignore-not-found >/dev/null 2>&1
  kubectl_local delete pv -l custody.io/demo=true --ignore-not-found >/dev/null 2>&1
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  kubectl_local delete node "$node_a" "$node_b" --ignore-not-found >/dev/null 2>&1
  kubectl_local delete nodeagent "$node_a" "$node_b" --ignore-not-found >/dev/null 2>&1
  # Bind mounts under the kubelet roots first, then the volumes.
  grep -o " $work/kubelet-[^ ]*" /proc/self/mounts | sort -r | while read -r m; do umount "$m"; done
  for mount in "${mounts[@]}"; do umount "$mount" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
# A previous run interrupted hard: start from nothing.
kubectl_local delete namespace "$ns" --ignore-not-found --timeout=60s >/dev/null 2>&1 || true
kubectl_local delete node "$node_a" "$node_b" --ignore-not-found >/dev/null 2>&1 || true
kubectl_local delete pv -l custody.io/demo=true --ignore-not-found >/dev/null 2>&1 || true
kubectl_local delete nodeagent "$node_a" "$node_b" --ignore-not-found >/dev/null 2>&1 || true

step "Starting the S3 server, custody-controller, two nodes and their agents"
cargo build -q --locked --bins
endpoint=$(hack/s3-up.sh | tail -1)
export AWS_ACCESS_KEY_ID=$CUSTODY_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$CUSTODY_S3_SECRET_KEY
bucket=custody-demo
hack/s3-mb.py "$endpoint" "$bucket"
# Certificates of the two gRPC channels: the agents' gate and the controller's report service.
(
  cd "$work"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt \
    -days 1 -subj /CN=custody-demo-ca 2>/dev/null
  for name in custody-agent custody-controller; do
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$name.key" -out "$name.csr" \
      -subj "/CN=$name" 2>/dev/null
    printf 'subjectAltName=DNS:%s,IP:127.0.0.1\n' "$name" >"$name.ext"
    openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
      -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  done
)
kc create namespace "$ns" >/dev/null
http_port=$(free_port) report_port=$(free_port) webhook_port=$(free_port)
# The webhook: pods labelled custody.io/cluster are sent to the controller; failurePolicy Fail,
# so none of them can start unguarded. The controller writes the caBundle itself.
kc apply -f - <<YAML
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: custody-demo}
webhooks:
- name: pods.custody.io
  clientConfig: {url: "https://127.0.0.1:$webhook_port/mutate-pods"}
  rules: [{operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}]
  namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: $ns}}
  objectSelector: {matchExpressions: [{key: custody.io/cluster, operator: Exists}]}
  failurePolicy: Fail
  sideEffects: None
  admissionReviewVersions: [v1]
  timeoutSeconds: 10
YAML
./target/debug/custody-controller run --namespace "$ns" --http-address "127.0.0.1:$http_port" \
  --report-address "127.0.0.1:$report_port" \
  --report-tls-cert "$work/custody-controller.crt" --report-tls-key "$work/custody-controller.key" \
  --agent-service-account "$ns:custody-agent" --agent-timeout-seconds 10 \
  --mover-image custody-mover:demo --wait-image custody-wait:demo --gate-ca-file "$work/ca.crt" \
  --webhook-address "127.0.0.1:$webhook_port" --webhook-configuration custody-demo \
  --webhook-secret "$ns/custody-webhook-tls" --webhook-names 127.0.0.1 >"$work/controller.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$http_port/readyz" >/dev/null && break; sleep 0.2; done
echo "controller ready; webhook caBundle: $(kubectl_local get mutatingwebhookconfiguration custody-demo \
  -o jsonpath='{.webhooks[0].clientConfig.caBundle}' | head -c 24)..."

# The nodes and the kubelet's part.
./target/debug/fake-kubelet --namespace "$ns" \
  --node "$node_a=$ip_a=$work/kubelet-a" --node "$node_b=$ip_b=$work/kubelet-b" \
  --tamper "data-orders-db-bad-0=base/16384/7" >"$work/kubelet.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do kubectl_local get node "$node_b" >/dev/null 2>&1 && break; sleep 0.2; done
kc get nodes -o wide | grep -E "^NAME|custody-demo"
# One agent per node, its gate on the node's address; it reports with a token bound to its pod.
kc -n "$ns" create serviceaccount custody-agent >/dev/null
for side in a b; do
  node_var=node_$side ip_var=ip_$side
  node=${!node_var} ip=${!ip_var}
  kc -n "$ns" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: custody-agent-$side, labels: {app: custody-agent}}
spec:
  nodeName: $node
  serviceAccountName: custody-agent
  containers: [{name: agent, image: custody-agent:demo}]
YAML
  kubectl_local -n "$ns" create token custody-agent --audience custody-report --duration 2h \
    --bound-object-kind Pod --bound-object-name "custody-agent-$side" >"$work/report-token-$side"
  ./target/debug/custody-agent --node-name "$node" --kubelet-root "$work/kubelet-$side" \
    --gate-address "$ip:9443" --gate-tls-cert "$work/custody-agent.crt" --gate-tls-key "$work/custody-agent.key" \
    --http-address "127.0.0.1:$(free_port)" \
    --report-url "https://127.0.0.1:$report_port" --report-ca "$work/ca.crt" \
    --report-server-name custody-controller --report-token-file "$work/report-token-$side" \
    --heartbeat-seconds 1 --clock-interval-seconds 2 >"$work/agent-$side.log" 2>&1 &
  pids+=($!)
done
for node in "$node_a" "$node_b"; do
  for _ in $(seq 100); do kubectl_local get nodeagent "$node" >/dev/null 2>&1 && break; sleep 0.2; done
  kc wait --for=condition=Ready=True --timeout=30s "nodeagent/$node" >/dev/null
done
kc get nodeagents "$node_a" "$node_b" -o wide

# Volumes: real ext4 filesystems on loop devices, offered as local PersistentVolumes on a node
# and pre-bound to the claim that will use them.
volume() { # volume NAME NODE CLAIM
  truncate -s 128M "$work/$1.img" && mkfs.ext4 -q -F -m 0 "$work/$1.img"
  mkdir -p "$work/$1" && mount -o loop "$work/$1.img" "$work/$1"
  mounts+=("$work/$1")
  kubectl_local apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: $ns-$3, labels: {custody.io/demo: "true"}}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: custody-local
  local: {path: "$work/$1"}
  claimRef: {namespace: $ns, name: $3}
  nodeAffinity: {required: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$2]}]}]}}
YAML
}
statefulset() { # statefulset NAME REPLICAS
  kc -n "$ns" apply -f - <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: $1}
spec:
  replicas: $2
  podManagementPolicy: Parallel
  serviceName: $1
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1, custody.io/cluster: $1}}
    spec:
      automountServiceAccountToken: false
      containers: [{name: postgres, image: postgres:17, volumeMounts: [{name: data, mountPath: /var/lib/postgresql/data}]}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], storageClassName: custody-local, resources: {requests: {storage: 128Mi}}}
YAML
}

step "A database and its data: Cluster orders-db, one replica on node a"
volume orders-src "$node_a" data-orders-db-0
mkdir -p "$work/orders-src/base/16384" "$work/orders-src/pg_wal"
for i in $(seq 1 2000); do echo "order $i shipped $(date +%F)" >"$work/orders-src/base/16384/$i"; done
head -c 16M /dev/urandom >"$work/orders-src/pg_wal/000000010000000000000001"
echo 17 >"$work/orders-src/PG_VERSION"
kc -n "$ns" create secret generic s3 \
  --from-literal=AWS_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" --from-literal=AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY" >/dev/null
kc -n "$ns" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: BackupRepository
metadata: {name: local-s3}
spec: {endpoint: "$endpoint", bucket: $bucket, prefix: custody, forcePathStyle: true, credentialsSecretRef: {name: s3}}
---
apiVersion: custody.io/v1alpha1
kind: Cluster
metadata: {name: orders-db}
spec: {statefulSetRef: {name: orders-db}, volumeClaimTemplates: [data], repositoryRef: {name: local-s3}}
YAML
statefulset orders-db 1
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Running --timeout=90s cluster.custody.io/orders-db
kc -n "$ns" wait --for=condition=Ready=True --timeout=30s backuprepository/local-s3 >/dev/null
kc -n "$ns" get clusters.custody.io,backuprepositories

step "A backup: the key is recorded first, then custody-mover streams the volume to S3"
kc -n "$ns" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: Backup
metadata: {name: orders-db-nightly}
spec: {clusterRef: {name: orders-db}}
YAML
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Completed --timeout=120s backup.custody.io/orders-db-nightly
kc -n "$ns" get backups.custody.io -o wide

step "A restore: Cluster orders-db-copy from that Backup, two replicas on two nodes"
volume copy-0 "$node_a" data-orders-db-copy-0
volume copy-1 "$node_b" data-orders-db-copy-1
kc -n "$ns" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: Cluster
metadata: {name: orders-db-copy}
spec:
  statefulSetRef: {name: orders-db-copy}
  volumeClaimTemplates: [data]
  restore: {backupRef: {name: orders-db-nightly}, volumeRestorePolicy: Parallel}
YAML
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Restoring --timeout=30s cluster.custody.io/orders-db-copy
statefulset orders-db-copy 2
echo "The webhook put custody-wait first in each pod; the pods wait in Init until their volume is verified:"
for _ in $(seq 50); do
  [[ $(kubectl_local -n "$ns" get pods -l app=orders-db-copy -o name | wc -l) == 2 ]] && break; sleep 0.2
done
kc -n "$ns" get pods -l app=orders-db-copy -o wide
kc -n "$ns" get pod orders-db-copy-0 -o jsonpath='init containers: {.spec.initContainers[*].name}; readiness gates: {.spec.readinessGates[*].conditionType}{"\n"}'
kc -n "$ns" get restores.custody.io
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Completed --timeout=120s restore.custody.io/orders-db-copy
kc -n "$ns" get restore.custody.io orders-db-copy \
  -o jsonpath='{range .status.volumes[*]}{.claimName} on {.nodeName}: {.state} ({.message}){"\n"}{end}'
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Running --timeout=60s cluster.custody.io/orders-db-copy
kc -n "$ns" get pods -l app=orders-db-copy -o wide
kc -n "$ns" get clusters.custody.io,restores.custody.io
kc get nodeagents "$node_a" "$node_b" -o wide
for copy in copy-0 copy-1; do
  diff -r --exclude=.custody --exclude=lost+found "$work/orders-src" "$work/$copy" >/dev/null \
    && echo "$copy: identical to the backed-up volume"
done

step "A damaged restore is refused: a byte changes on the volume after the mover wrote it"
volume bad-0 "$node_b" data-orders-db-bad-0
kc -n "$ns" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: Cluster
metadata: {name: orders-db-bad}
spec:
  statefulSetRef: {name: orders-db-bad}
  volumeClaimTemplates: [data]
  restore: {backupRef: {name: orders-db-nightly}}
YAML
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Restoring --timeout=30s cluster.custody.io/orders-db-bad
statefulset orders-db-bad 1
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Failed --timeout=120s restore.custody.io/orders-db-bad
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Failed --timeout=30s cluster.custody.io/orders-db-bad
kc -n "$ns" get restore.custody.io orders-db-bad \
  -o jsonpath='{range .status.volumes[*]}{.claimName}: {.state} {.reason}: {.message}{"\n"}{end}'
sleep 2
kc -n "$ns" get pods -l app=orders-db-bad -o wide
echo "(the pod stays in Init: custody-wait does not release a volume that failed verification)"
kc -n "$ns" get events --field-selector type=Warning,involvedObject.kind=Restore
kc -n "$ns" get clusters.custody.io

step "Cancelling: deleting a Cluster tears down what custody created for it, and only that"
kc -n "$ns" delete cluster.custody.io orders-db-bad --timeout=60s
kc -n "$ns" get restores.custody.io,jobs

step "Done"
echo "Control plane still running for exploration: KUBECONFIG=$KUBECONFIG; stop it with hack/cluster-down.sh"
