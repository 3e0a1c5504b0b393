#!/usr/bin/env bash
# custody's test suite: installs what it needs, builds and starts the local control plane
# (etcd + kube-apiserver + kube-controller-manager, cached after the first build), builds
# custody's binaries and runs every test against them; then starts a real node (kubelet,
# containerd), builds custody's images and runs the real-node tier. Ends with one summary line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source hack/lib.sh
hack/prerequisites.sh
hack/cluster-up.sh >/dev/null
# The buckets of earlier runs (`<test>-<8 hex digits>`; a failed run's stay until the next
# one, to be looked at) would fill the disk: about 1 GB a run.
endpoint=$(hack/s3-up.sh | tail -1)
AWS_ACCESS_KEY_ID=$CUSTODY_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$CUSTODY_S3_SECRET_KEY \
  hack/s3.py sweep "$endpoint" '[a-z0-9-]+-[0-9a-f]{8}' >&2
cargo build --workspace --bins --locked
# An install of custody that an interrupted real-node tier left would send every pod and
# custody object of tier 1 to a controller that is gone (failurePolicy Fail).
kubectl_local delete --ignore-not-found mutatingwebhookconfiguration/custody-restore-gate \
  validatingwebhookconfiguration/custody-requester-check >/dev/null
log=$(mktemp)
# The images' static binaries are the longest build of a cold run (about 14 minutes on two
# cores): they build beside tier 1 at the lowest priority, and tier 2 waits for them.
images_log=$(mktemp)
setsid nice -n 19 hack/build-images.sh --binaries-only >"$images_log" 2>&1 &
images=$!
# Prometheus and promtool (deploy/monitoring's tests), once per version, likewise; the tests
# that need them wait for this build (a lock in the script).
setsid nice -n 19 hack/build-prometheus.sh >/dev/null 2>&1 &
prometheus=$!
# The real node's kubelet, kube-proxy and CoreDNS, and helm (tier 2), likewise: built after
# tier 1 they took about three minutes of a cold run, and helm most of one of tier 2's tests.
setsid nice -n 19 bash -c 'hack/build-node.sh; hack/build-helm.sh' >/dev/null 2>&1 &
node_tools=$!
trap 'kill -- -"$images" -"$prometheus" -"$node_tools" 2>/dev/null || true; rm -f "$log" "$images_log"' EXIT
status=0
# Tier 1: unit tests and everything on the control plane with fake kubelets (the real node's
# tests are skipped here: its cluster-wide install would intercept these namespaces).
args=("$@")
if [[ " ${args[*]} " == *" -- "* ]]; then args+=(--skip on_a_real_node); else args+=(-- --skip on_a_real_node); fi
# Four tests at a time per binary (the harness's default is one per core, two here): these tests
# mostly wait on the API server, the S3 server and their controllers (a perf of artifacts.rs
# found the cores idle 74% of its run). The five longest binaries took 573 s at four and 477 s
# at six, against 1172 s at two in the CI run before (which also lacked Cargo.toml's optimised
# crypto crates). RUST_TEST_THREADS set by the caller wins.
RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}" \
  cargo test --workspace --locked --no-fail-fast --lib --bins --tests "${args[@]}" 2>&1 | tee "$log" || status=$?
# Tier 2: a real node (kubelet, containerd), custody's images built here and installed from
# deploy/ as users install it.
if ! wait "$images"; then
  cat "$images_log" >&2
  echo "custody: the images' binaries did not build" >&2
  exit 1
fi
trap 'rm -f "$log" "$images_log"; hack/node-down.sh' EXIT
# A fake-kubelet test that failed may leave its fake Node behind; the DaemonSet and the
# Deployment installed next would place pods there that never run.
kubectl_local delete nodes -l custody.io/test=true --ignore-not-found >/dev/null
hack/node-up.sh >/dev/null
hack/build-images.sh --import >/dev/null
# Three tests at a time (the harness's default is two here): they mostly wait on pods, MariaDB
# and PostgreSQL starting, and the 3 MB/s relays; the tests that restart the agents take them
# alone (AGENTS in tests/node/main.rs). The tier took 1222 s at two in a cold CI run.
RUST_TEST_THREADS="${RUST_TEST_THREADS:-3}" \
  cargo test -p custody-tests --test node --locked --no-fail-fast 2>&1 | tee -a "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i } }
     END { printf "custody: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
