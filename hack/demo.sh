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
cargo build -q -p custody-controller --locked
namespace=custody-demo
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log_file=$(mktemp)
./target/debug/custody-controller run --http-address "127.0.0.1:$port" >"$log_file" 2>&1 &
controller=$!
cleanup() {
  kill "$controller" 2>/dev/null && wait "$controller" 2>/dev/null || true
  kubectl_local delete namespace "$namespace" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  rm -f "$log_file"
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

step "Done"
echo "Control plane still running for exploration: KUBECONFIG=$KUBECONFIG; stop it with hack/cluster-down.sh"
