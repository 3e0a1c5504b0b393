#!/usr/bin/env bash
# custody on a local embedded default: a real control plane on loopback, custody's CRDs and
# its controller. What it shows grows with the project; see the README for today's scope.
# Cleans up after itself (its namespace and the controller); a second run works.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source hack/lib.sh

hack/prerequisites.sh
KUBECONFIG=$(hack/cluster-up.sh | tail -1)
export KUBECONFIG
kc() { echo "+ kubectl $*" >&2; kubectl_local "$@"; }
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Installing custody's CRDs"
kc apply --server-side --force-conflicts --field-manager=custody-installer -f deploy/crds/ >/dev/null
# shellcheck disable=SC2046
kc wait --for=condition=Established --timeout=60s $(ls deploy/crds | sed 's/^/crd\//; s/\.yaml$//') >/dev/null
kc get crds | grep -E '^NAME|custody.io'

step "Starting custody-controller"
cargo build -q --locked --bins
namespace=custody-demo
node=custody-demo-node
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
report_port=$(free_port)
work=$(mktemp -d)
# Certificates for the two gRPC channels: the agent's gate and the controller's report service.
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
./target/debug/custody-controller run --http-address "127.0.0.1:$port" \
  --report-address "127.0.0.1:$report_port" \
  --report-tls-cert "$work/custody-controller.crt" --report-tls-key "$work/custody-controller.key" \
  --agent-service-account "$namespace:custody-agent" --agent-timeout-seconds 5 >"$work/controller.log" 2>&1 &
controller=$!
agent=
kubelet=
mounts=()
cleanup() {
  [[ -n "$agent" ]] && { kill "$agent" 2>/dev/null && wait "$agent" 2>/dev/null || true; }
  [[ -n "$kubelet" ]] && { kill "$kubelet" 2>/dev/null && wait "$kubelet" 2>/dev/null || true; }
  for mount in "${mounts[@]}"; do umount "$mount" 2>/dev/null || true; done
  kill "$controller" 2>/dev/null && wait "$controller" 2>/dev/null || true
  kubectl_local delete namespace "$namespace" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  kubectl_local delete node "$node" --ignore-not-found >/dev/null 2>&1 || true
  kubectl_local delete nodeagent "$node" --ignore-not-found >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
curl -fsS "http://127.0.0.1:$port/readyz"; echo " (readyz)"

step "A Cluster with an annotation custody does not know"
kubectl_local delete namespace "$namespace" --ignore-not-found --wait=true >/dev/null
kc create namespace "$namespace" >/dev/null
kc -n "$namespace" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: Cluster
metadata:
  name: orders-db
  annotations:
    custody.io/restore-from: orders-db-nightly   # not a custody annotation: reported, never ignored
spec:
  statefulSetRef: {name: orders-db}
  volumeClaimTemplates: [data]
YAML
kc -n "$namespace" wait --for=condition=AnnotationsRecognized=False --timeout=30s cluster.custody.io/orders-db
kc -n "$namespace" get clusters.custody.io
kc -n "$namespace" get cluster.custody.io orders-db \
  -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}'
kc -n "$namespace" get events --field-selector reason=UnknownAnnotation

step "The API server refuses a change to spec.restore"
kc -n "$namespace" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: Cluster
metadata: {name: restored-db}
spec:
  statefulSetRef: {name: restored-db}
  volumeClaimTemplates: [data]
  restore: {backupRef: {name: orders-db-nightly}}
YAML
kc -n "$namespace" patch cluster.custody.io restored-db --type merge \
  -p '{"spec":{"restore":{"backupRef":{"name":"something-else"}}}}' || true

step "Removing the annotation clears the condition"
kc -n "$namespace" annotate cluster.custody.io orders-db custody.io/restore-from-
kc -n "$namespace" wait --for=condition=AnnotationsRecognized=True --timeout=30s cluster.custody.io/orders-db

step "A node agent reports to the controller; kubectl shows each node's restore health"
# No kubelet runs here: the demo registers a Node and creates the agent's pod object itself,
# so that the API server can bind the agent's report token to a pod on that node.
kubectl_local delete nodeagent "$node" --ignore-not-found >/dev/null
kc apply -f - <<YAML
apiVersion: v1
kind: Node
metadata: {name: $node}
YAML
kc -n "$namespace" create serviceaccount custody-agent
kc -n "$namespace" create serviceaccount orders-db
kc -n "$namespace" apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: custody-agent-demo}
spec:
  nodeName: $node
  serviceAccountName: custody-agent
  containers: [{name: agent, image: custody-agent}]
---
apiVersion: v1
kind: Pod
metadata:
  name: orders-db-0
  labels: {custody.io/restore-uid: demo-restore-uid}
  annotations: {custody.io/restore: orders-db-restore, custody.io/restored-claims: data-orders-db-0}
spec:
  nodeName: $node
  serviceAccountName: orders-db
  containers: [{name: db, image: postgres}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data-orders-db-0}}]
YAML
kc -n "$namespace" create token custody-agent --audience custody-report \
  --bound-object-kind Pod --bound-object-name custody-agent-demo >"$work/report-token"
mkdir -p "$work/kubelet"
gate_port=$(free_port)
./target/debug/custody-agent --node-name "$node" --kubelet-root "$work/kubelet" \
  --gate-address "127.0.0.1:$gate_port" \
  --gate-tls-cert "$work/custody-agent.crt" --gate-tls-key "$work/custody-agent.key" \
  --http-address "127.0.0.1:$(free_port)" \
  --report-url "https://127.0.0.1:$report_port" --report-ca "$work/ca.crt" \
  --report-server-name custody-controller --report-token-file "$work/report-token" \
  --heartbeat-seconds 1 --clock-interval-seconds 1 >"$work/agent.log" 2>&1 &
agent=$!
for _ in $(seq 100); do kubectl_local get nodeagent "$node" >/dev/null 2>&1 && break; sleep 0.2; done
kc wait --for=condition=Ready=True --timeout=30s "nodeagent/$node"
kc get nodeagents "$node" -o wide

step "custody-wait holds orders-db-0: its volume has not been restored and verified"
kc -n "$namespace" create token orders-db --audience custody \
  --bound-object-kind Pod --bound-object-name orders-db-0 >"$work/gate-token"
timeout 3 ./target/debug/custody-wait --agent "127.0.0.1:$gate_port" --token-file "$work/gate-token" \
  --ca-file "$work/ca.crt" || echo "(custody-wait still blocking after 3 s: the pod would not start)"

step "A backup: the controller records the key, the mover streams the volume to S3"
endpoint=$(hack/s3-up.sh | tail -1)
export AWS_ACCESS_KEY_ID=$CUSTODY_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$CUSTODY_S3_SECRET_KEY
bucket=custody-demo
hack/s3-mb.py "$endpoint" "$bucket"
# The volume: a real ext4 filesystem on a loop device with some "database" files.
truncate -s 128M "$work/data.img" && mkfs.ext4 -q -F -m 0 "$work/data.img"
mkdir -p "$work/data" && mount -o loop "$work/data.img" "$work/data"
mounts+=("$work/data")
mkdir -p "$work/data/base/16384" "$work/data/pg_wal"
for i in $(seq 1 2000); do echo "order $i shipped $(date +%F)" > "$work/data/base/16384/$i"; done
head -c 16M /dev/urandom > "$work/data/pg_wal/000000010000000000000001"
echo 17 > "$work/data/PG_VERSION"
kc -n "$namespace" create secret generic s3 \
  --from-literal=AWS_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" --from-literal=AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY"
kc -n "$namespace" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: BackupRepository
metadata: {name: local-s3}
spec: {endpoint: "$endpoint", bucket: $bucket, prefix: custody, forcePathStyle: true, credentialsSecretRef: {name: s3}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data-orders-db-0}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
YAML
kc wait -n "$namespace" --for=condition=Ready=True --timeout=60s backuprepository/local-s3
kc -n "$namespace" get backuprepositories
# No kubelet runs here: mark orders-db-0 running, and let tests/'s fake kubelet run the Job
# pods custody creates (the real custody-mover, with the claim mapped to the volume).
kc -n "$namespace" patch pod orders-db-0 --subresource=status --type=merge -p '{"status":{"phase":"Running"}}' >/dev/null
./target/debug/fake-kubelet --namespace "$namespace" --node "$node" --claim "data-orders-db-0=$work/data" >"$work/kubelet.log" 2>&1 &
kubelet=$!
kc -n "$namespace" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: Backup
metadata: {name: orders-db-first}
spec: {clusterRef: {name: orders-db}, repositoryRef: {name: local-s3}}
YAML
kc -n "$namespace" wait --for=jsonpath='{.status.phase}'=Completed --timeout=120s backup.custody.io/orders-db-first
kc -n "$namespace" get backups.custody.io -o wide
kc -n "$namespace" get backup.custody.io orders-db-first -o jsonpath='{.status.artifact}'; echo

step "A restore of that artifact into a fresh volume, verified file by file against its manifest"
truncate -s 128M "$work/restore.img" && mkfs.ext4 -q -F -m 0 "$work/restore.img"
mkdir -p "$work/restore" && mount -o loop "$work/restore.img" "$work/restore"
mounts+=("$work/restore")
artifact() { kubectl_local -n "$namespace" get backup.custody.io orders-db-first -o jsonpath="{.status.artifact.$1}"; }
backup_uid=$(kubectl_local -n "$namespace" get backup.custody.io orders-db-first -o jsonpath='{.metadata.uid}')
./target/debug/custody-mover restore --target "$work/restore" --key "$(artifact key)" \
  --manifest-key "$(artifact manifestKey)" --manifest-hash "$(artifact manifestHash)" \
  --backup-uid "$backup_uid" --restore-uid demo-restore --endpoint "$endpoint" --bucket "$bucket" --path-style
./target/debug/custody-mover verify --target "$work/restore" --manifest-hash "$(artifact manifestHash)" \
  --backup-uid "$backup_uid" --restore-uid demo-restore
echo "one byte changed on the restored volume:"
printf 'X' | dd of="$work/restore/base/16384/7" bs=1 seek=0 conv=notrunc 2>/dev/null
./target/debug/custody-mover verify --target "$work/restore" --manifest-hash "$(artifact manifestHash)" \
  --backup-uid "$backup_uid" --restore-uid demo-restore || echo "(verification refused the damaged volume)"

step "The agent stops: its node turns not Ready"
kill "$agent"; wait "$agent" 2>/dev/null || true; agent=
kc wait --for=condition=Ready=False --timeout=30s "nodeagent/$node"
kc get nodeagents "$node"

step "Done"
echo "Control plane still running for exploration: KUBECONFIG=$KUBECONFIG; stop it with hack/cluster-down.sh"
