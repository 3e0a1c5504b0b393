#!/usr/bin/env bash
# custody on a local embedded default: a real control plane on this machine (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler), a MinIO S3 server and one real node
# (kubelet, Debian's containerd and runc, CNI, kube-proxy, CoreDNS). custody's images are built
# from this repository and installed as users install them: `kubectl apply -k deploy/`, nothing
# made by hand first (the controller makes every certificate). The application is PostgreSQL 15 (an image assembled from
# Debian's packages), run by a StatefulSet on real ext4 volumes.
#
# It fills a database, shows that a backup of it while it runs is refused without a
# consistency method, then backs it up while pgbench writes, with pg_basebackup streaming into
# an encrypted repository (restic's format: the password is in a Secret, and restic itself lists
# the snapshot), restores it into a new Cluster whose pod custody-wait holds in Init until the
# node's agent verified the volume (`kubectl custody why` says so), queries the restored
# database (pgbench's balances agree, pg_amcheck clean), runs a restore drill of a BackupPlan
# (its newest Backup restored into a throwaway Cluster, pg_amcheck asked, everything it made
# deleted), then shows a restore of a damaged pack refused and its pod kept from starting. Cleans up after itself (custody uninstalled but for its CRDs and
# namespace, the node stopped; the control plane and MinIO keep running); a second run works.
#
# What it changes on this machine: it runs as root; installs Debian packages (containerd, runc,
# CNI plugins, buildah, iptables, musl-tools, restic, PostgreSQL…); builds and starts
# etcd, a kube-apiserver, MinIO, a kubelet and containerd on this host (iptables rules, mounts
# under /var/lib/kubelet, a bridge network); mounts ext4 images on loop devices. Run it on a
# machine you can throw away.
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
printf '\033[1mcustody demo\033[0m: runs as root, installs packages and starts a kubelet, containerd and a control plane on this machine (see the top of hack/demo.sh): use a throwaway machine.\n'
work=$(mktemp -d)
mounts=()
uninstall() {
  kubectl_local delete namespace "$ns" --ignore-not-found --timeout=120s >/dev/null 2>&1
  kubectl_local delete pv -l custody.io/demo=true --ignore-not-found >/dev/null 2>&1
  kubectl_local delete mutatingwebhookconfiguration custody-restore-gate --ignore-not-found >/dev/null 2>&1
  kubectl_local delete validatingwebhookconfiguration custody-requester-check --ignore-not-found >/dev/null 2>&1
  kubectl_local -n custody-system delete --ignore-not-found deployment/custody-controller \
    daemonset/custody-agent service/custody-controller >/dev/null 2>&1
}
cleanup() {
  set +e
  # The namespace goes while the controller (finalizers) and the kubelet (pods) still run.
  uninstall
  hack/node-down.sh >/dev/null 2>&1
  for mount in "${mounts[@]}"; do umount "$mount" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
uninstall || true # a previous run interrupted hard

step "Starting MinIO and a real node: kubelet, containerd, runc, CNI, kube-proxy, CoreDNS"
endpoint=$(hack/s3-up.sh | tail -1)
export AWS_ACCESS_KEY_ID=$CUSTODY_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$CUSTODY_S3_SECRET_KEY
bucket=custody-demo
hack/s3.py mb "$endpoint" "$bucket"
# Pods reach MinIO on the host address.
pods_endpoint="http://$HOST_IP:${endpoint##*:}"
node=$(hack/node-up.sh | tail -1)
kc get nodes -o wide

step "Building custody's images from this repository, and PostgreSQL's from Debian's packages"
hack/build-images.sh --import >/dev/null
hack/build-postgres-image.sh --import >/dev/null

step "Installing custody as users do: kubectl apply -k deploy/ (the controller makes every certificate)"
kc apply -k deploy/
kc -n custody-system rollout status deployment/custody-controller --timeout=180s
kc -n custody-system rollout status daemonset/custody-agent --timeout=180s
kc -n custody-system get pods -o wide
for _ in $(seq 120); do kubectl_local get nodeagent "$node" >/dev/null 2>&1 && break; sleep 1; done
kc wait --for=condition=Ready=True --timeout=120s "nodeagent/$node" >/dev/null
kc get nodeagents -o wide

# Volumes: real ext4 filesystems on loop devices, offered as local PersistentVolumes on the
# node and bound to the claim that will use them. PostgreSQL runs as uid 999.
volume() { # volume NAME CLAIM
  truncate -s 384M "$work/$1.img" && mkfs.ext4 -q -F -m 0 "$work/$1.img"
  mkdir -p "$work/$1" && mount -o loop "$work/$1.img" "$work/$1"
  mounts+=("$work/$1")
  chown 999:999 "$work/$1"
  kubectl_local apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: $ns-$2, labels: {custody.io/demo: "true"}}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: custody-demo
  local: {path: "$work/$1"}
  claimRef: {namespace: $ns, name: $2}
  nodeAffinity: {required: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$node]}]}]}}
YAML
}
postgres() { # postgres NAME: a StatefulSet of one PostgreSQL pod for Cluster NAME
  kc -n "$ns" apply -f - <<YAML
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: $1}
spec:
  replicas: 1
  serviceName: $1
  selector: {matchLabels: {app: $1}}
  template:
    metadata: {labels: {app: $1, custody.io/cluster: $1}}
    spec:
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, runAsUser: 999, runAsGroup: 999, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: db
        image: localhost/custody/postgres:15
        imagePullPolicy: Never
        # The password pg_basebackup connects with (a new database's; the image sets it).
        env: [{name: POSTGRES_PASSWORD, valueFrom: {secretKeyRef: {name: orders-db-credentials, key: PGPASSWORD}}}]
        securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
        readinessProbe: {exec: {command: [pg_isready, -q]}, periodSeconds: 1}
        volumeMounts: [{name: data, mountPath: /var/lib/postgresql/data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec: {accessModes: [ReadWriteOnce], storageClassName: custody-demo, resources: {requests: {storage: 128Mi}}}
YAML
}
psql() { # psql POD SQL
  kubectl_local -n "$ns" exec "$1" -c db -- psql -Atc "$2"
}
# kubectl custody, the plugin (kubectl/ in this repository).
cargo build -q --locked -p custody-kubectl
custody() { echo "+ kubectl custody $*" >&2; "$CARGO_TARGET_DIR/debug/kubectl-custody" "$@"; }
accounts="select count(*) || ' accounts, balance ' || sum(abalance) || ', digest ' || md5(string_agg(aid || ':' || abalance, ',' order by aid)) from pgbench_accounts"

step "A database: Cluster orders-db, PostgreSQL on node $node"
kc create namespace "$ns" >/dev/null
volume orders data-orders-db-0
kc -n "$ns" create secret generic s3 \
  --from-literal=AWS_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" --from-literal=AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY" >/dev/null
# The repository's password: losing every password loses the backups. (The demo keeps one in
# its work directory to show restic reading the repository.)
password=$(openssl rand -hex 24)
echo "$password" > "$work/repository-password"
kc -n "$ns" create secret generic local-s3-keys --from-literal=password="$password" >/dev/null
kc -n "$ns" create secret generic orders-db-credentials --from-literal=PGUSER=postgres \
  --from-literal=PGPASSWORD="$(openssl rand -hex 12)" >/dev/null
prefix=custody-$(date +%s)
kc -n "$ns" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: BackupRepository
metadata: {name: local-s3}
spec: {endpoint: "$pods_endpoint", bucket: $bucket, prefix: $prefix, forcePathStyle: true, credentialsSecretRef: {name: s3},
       encryption: {keySecretRef: {name: local-s3-keys}}}
---
apiVersion: custody.io/v1alpha1
kind: Cluster
metadata: {name: orders-db}
spec: {statefulSetRef: {name: orders-db}, volumeClaimTemplates: [data], repositoryRef: {name: local-s3}}
YAML
postgres orders-db
for _ in $(seq 120); do kubectl_local -n "$ns" get pod orders-db-0 >/dev/null 2>&1 && break; sleep 1; done
kc -n "$ns" wait --for=condition=Ready --timeout=180s pod/orders-db-0
kubectl_local -n "$ns" exec orders-db-0 -c db -- pgbench -i -s 3 -q 2>&1 | tail -1
kubectl_local -n "$ns" exec orders-db-0 -c db -- pgbench -c 2 -t 300 -n | grep -E '^(number of transactions actually|tps)'
psql orders-db-0 "create extension amcheck" >/dev/null
before=$(psql orders-db-0 "$accounts")
echo "orders-db: $before"
kc -n "$ns" wait --for=condition=Ready=True --timeout=60s backuprepository/local-s3 >/dev/null
kc -n "$ns" get ccl,brepo

step "A backup while PostgreSQL runs, with no consistency method: refused"
kc -n "$ns" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: Backup
metadata: {name: orders-db-live}
spec: {clusterRef: {name: orders-db}}
YAML
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Failed --timeout=60s cbk/orders-db-live
kc -n "$ns" get cbk orders-db-live \
  -o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.reason}: {.message}{"\n"}{end}'

step "While pgbench writes, it is backed up: pg_basebackup streams into the repository (method Tool)"
# pg_basebackup's tar on standard output takes the WAL written meanwhile from the server: keep it.
psql orders-db-0 "alter system set wal_keep_size = '256MB'" >/dev/null
psql orders-db-0 "select pg_reload_conf()" >/dev/null
kubectl_local -n "$ns" exec orders-db-0 -c db -- pgbench -c 2 -T 25 -n >"$work/pgbench.log" 2>&1 &
load=$!
sleep 3
# The consistency of the demo's backups: pg_basebackup's tar read by the mover as written.
streamed_tool=$(cat <<'YAML'
  consistency:
    method: Tool
    tool:
      image: localhost/custody/postgres:15
      command: [pg_basebackup, --host=$(CUSTODY_POD_IP), --pgdata=-, --format=tar, --wal-method=fetch, --checkpoint=fast, --no-password]
      output: TarStream
      credentialsSecretRef: {name: orders-db-credentials}
      dataPath: pgdata
YAML
)
kc -n "$ns" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: Backup
metadata: {name: orders-db-nightly}
spec:
  clusterRef: {name: orders-db}
$streamed_tool
YAML
custody status -n "$ns" orders-db
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Completed --timeout=180s cbk/orders-db-nightly
wait "$load"
grep -E '^(number of transactions actually|tps)' "$work/pgbench.log"
kc -n "$ns" get cbk -o wide
kc -n "$ns" get cbk orders-db-nightly \
  -o jsonpath='snapshot {.status.artifact.snapshot.id} in repository {.status.artifact.snapshot.repositoryId}{"\n"}'
# The pack the damaged-backup step changes: the largest of this Backup's (later Backups add
# packs of their own).
damaged=$(hack/s3.py largest "$endpoint" "$bucket" "$prefix/custody_repository/data/")
echo "restic opens the same repository with the password (no custody needed to read it):"
RESTIC_PASSWORD="$password" restic -r "s3:$endpoint/$bucket/$prefix/custody_repository" --no-cache snapshots

step "A restore: Cluster orders-db-copy, its pod held in Init until the agent verified the volume"
volume copy data-orders-db-copy-0
started=$(date +%s.%N)
kc -n "$ns" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: Cluster
metadata: {name: orders-db-copy}
spec: {statefulSetRef: {name: orders-db-copy}, volumeClaimTemplates: [data], restore: {backupRef: {name: orders-db-nightly}}}
YAML
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Restoring --timeout=30s ccl/orders-db-copy
postgres orders-db-copy
for _ in $(seq 100); do kubectl_local -n "$ns" get pod orders-db-copy-0 >/dev/null 2>&1 && break; sleep 0.2; done
echo "The admission webhook put custody-wait first in the pod and a readiness gate on it:"
kc -n "$ns" get pod orders-db-copy-0 \
  -o jsonpath='init containers: {.spec.initContainers[*].name}; readiness gates: {.spec.readinessGates[*].conditionType}{"\n"}'
kc -n "$ns" get pods,crs
custody why -n "$ns" orders-db-copy-0 --lines 3 || true
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Completed --timeout=180s crs/orders-db-copy
kc -n "$ns" get crs orders-db-copy \
  -o jsonpath='{range .status.volumes[*]}{.claimName} on {.nodeName}: {.state} ({.message}){"\n"}{end}'
kc -n "$ns" wait --for=condition=Ready --timeout=180s pod/orders-db-copy-0
after=$(psql orders-db-copy-0 "$accounts")
echo "orders-db-copy: $after ($(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $started}") s from the Cluster's creation)"
# Copied while pgbench wrote: the rows are those of the backup's moment; every transaction in
# it is whole (pgbench moves each delta through an account, a teller, a branch and the history).
sums=$(psql orders-db-copy-0 "select (select sum(abalance) from pgbench_accounts) || ' ' || (select sum(tbalance) from pgbench_tellers) || ' ' || (select sum(bbalance) from pgbench_branches) || ' ' || (select coalesce(sum(delta), 0) from pgbench_history)")
echo "restored balances (accounts, tellers, branches, history): $sums"
read -r a t b h <<<"$sums"
[[ "$a" == "$t" && "$t" == "$b" && "$b" == "$h" ]] || { echo "the restored balances disagree" >&2; exit 1; }
[[ "${after%% *}" == "${before%% *}" ]] || { echo "the restored database has other accounts" >&2; exit 1; }
kubectl_local -n "$ns" exec orders-db-copy-0 -c db -- pg_amcheck --heapallindexed postgres \
  && echo "pg_amcheck --heapallindexed: no corruption"
kc -n "$ns" get ccl,crs
custody nodes

step "A restore drill: a plan's newest Backup restored into a throwaway Cluster, then PostgreSQL asked"
# custody creates the drill's StatefulSet only where the namespace's admin allows it.
kc -n "$ns" create rolebinding custody-drills --clusterrole custody-drills \
  --serviceaccount custody-system:custody-controller >/dev/null
volume drill data-orders-db-weekly-drill-0
kc -n "$ns" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: BackupPlan
metadata: {name: orders-db-weekly}
spec:
  clusterRef: {name: orders-db}
  schedule: "0 3 * * 0"
$streamed_tool
  drill:
    schedule: "* * * * *"   # every minute, for the demo; weekly is more usual
    check:
      command: [sh, -c, 'pg_amcheck -h "\$CUSTODY_DRILL_HOST" --heapallindexed postgres && echo "pg_amcheck: clean"']
      credentialsSecretRef: {name: orders-db-credentials}
YAML
custody backup -n "$ns" --plan orders-db-weekly --name orders-db-weekly-1 --wait
echo "The drill starts at the next minute: restore, the agent's verification, PostgreSQL, pg_amcheck."
kc -n "$ns" wait --for=jsonpath='{.status.drill.last.backup}'=orders-db-weekly-1 --timeout=300s cbp/orders-db-weekly
kc -n "$ns" patch cbp orders-db-weekly --type=merge -p '{"spec":{"suspend":true}}' >/dev/null
kc -n "$ns" get cbp
kc -n "$ns" get cbp orders-db-weekly \
  -o jsonpath='{.status.drill.last.result} ({.status.drill.last.reason}): {.status.drill.last.message}{"\n"}'
kc -n "$ns" get cbk orders-db-weekly-1 \
  -o jsonpath='{range .status.conditions[?(@.type=="Drilled")]}Backup orders-db-weekly-1 Drilled={.status}: {.reason}{"\n"}{end}'
result=$(kubectl_local -n "$ns" get cbp orders-db-weekly -o jsonpath='{.status.drill.last.result}')
[[ "$result" == Passed ]] || { echo "the drill did not pass" >&2; exit 1; }
for _ in $(seq 120); do
  [[ -z "$(kubectl_local -n "$ns" get cbp orders-db-weekly -o jsonpath='{.status.drill.current}')" ]] && break
  sleep 1
done
echo "What the drill made is gone:"
kc -n "$ns" get ccl,sts,pvc

step "A damaged backup is refused: one byte of a pack changed in S3, the pod never starts"

hack/s3.py flip-byte "$endpoint" "$bucket" "$damaged"
volume bad data-orders-db-bad-0
kc -n "$ns" apply -f - <<YAML
apiVersion: custody.io/v1alpha1
kind: Cluster
metadata: {name: orders-db-bad}
spec: {statefulSetRef: {name: orders-db-bad}, volumeClaimTemplates: [data], restore: {backupRef: {name: orders-db-nightly}}}
YAML
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Restoring --timeout=30s ccl/orders-db-bad
postgres orders-db-bad
kc -n "$ns" wait --for=jsonpath='{.status.phase}'=Failed --timeout=180s crs/orders-db-bad
kc -n "$ns" get crs orders-db-bad \
  -o jsonpath='{range .status.volumes[*]}{.claimName}: {.state} {.reason} ({.message}){"\n"}{end}'
sleep 5
kc -n "$ns" get pod orders-db-bad-0 -o wide
phase=$(kubectl_local -n "$ns" get pod orders-db-bad-0 -o jsonpath='{.status.phase}')
[[ "$phase" == Pending ]] || { echo "orders-db-bad-0 is $phase: it should be held" >&2; exit 1; }
kc -n "$ns" get ccl,crs

step "Done"
echo "custody, installed from deploy/, restored a PostgreSQL database on a real node and released"
echo "its pod only once the node's agent had verified the volume; the damaged restore stays held."
