# Shared by the hack/ scripts: versions, ports, paths and process helpers. Source it.
# (Not ETCD_*: etcd reads every ETCD_* variable in its environment as a flag.)
CUSTODY_KUBE_VERSION="${CUSTODY_KUBE_VERSION:-v1.36.3}"
CUSTODY_ETCD_VERSION="${CUSTODY_ETCD_VERSION:-v3.6.16}"
CUSTODY_MINIO_VERSION="${CUSTODY_MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
CUSTODY_KOPIA_VERSION="${CUSTODY_KOPIA_VERSION:-v0.21.1}"
CUSTODY_COREDNS_VERSION="${CUSTODY_COREDNS_VERSION:-v1.14.7}"
CUSTODY_HELM_VERSION="${CUSTODY_HELM_VERSION:-v3.22.0}"
# Prometheus 3.x (its Go module is versioned v0.3xx).
CUSTODY_PROMETHEUS_VERSION="${CUSTODY_PROMETHEUS_VERSION:-v0.316.0}"
export CUSTODY_KUBE_VERSION CUSTODY_ETCD_VERSION CUSTODY_MINIO_VERSION CUSTODY_KOPIA_VERSION CUSTODY_COREDNS_VERSION CUSTODY_HELM_VERSION CUSTODY_PROMETHEUS_VERSION
CUSTODY_CACHE="${CUSTODY_CACHE:-$HOME/.cache/custody}"
CLUSTER_DIR="${CUSTODY_CLUSTER_DIR:-$CUSTODY_CACHE/cluster}"
# Cargo's build output: outside the repository, one directory per Rust toolchain
# (rust-toolchain.toml's channel), so a fresh clone builds warm and clones share the space.
if [[ -z "${CARGO_TARGET_DIR:-}" ]]; then
  CARGO_TARGET_DIR="$CUSTODY_CACHE/cargo-target/rust-$(sed -n 's/^channel = "\(.*\)"$/\1/p' \
    "$(dirname "${BASH_SOURCE[0]}")/../rust-toolchain.toml")"
  export CARGO_TARGET_DIR
fi
KUBECONFIG_PATH="$CLUSTER_DIR/kubeconfig"
APISERVER_PORT="${CUSTODY_APISERVER_PORT:-16443}"
ETCD_PORT="${CUSTODY_ETCD_PORT:-12379}"
ETCD_PEER_PORT="${CUSTODY_ETCD_PEER_PORT:-12380}"
ETCD_METRICS_PORT="${CUSTODY_ETCD_METRICS_PORT:-12381}"
KCM_PORT="${CUSTODY_KCM_PORT:-10357}"
SCHEDULER_PORT="${CUSTODY_SCHEDULER_PORT:-10359}"
# The host's own address for a real node (hack/node-up.sh): on the loopback device, reached by
# pods through the node's bridge. Pod and Service ranges of the local cluster.
HOST_IP="${CUSTODY_HOST_IP:-10.250.0.1}"
POD_CIDR="${CUSTODY_POD_CIDR:-10.244.0.0/24}"
SERVICE_CIDR="10.96.0.0/16"
# A real node (hack/node-up.sh): its name, containerd's root and state, the local pause image.
NODE_NAME="${CUSTODY_NODE_NAME:-custody-node}"
NODE_DIR="${CUSTODY_NODE_DIR:-/var/lib/custody-node}"
NODE_RUN="${CUSTODY_NODE_RUN:-/run/custody-node}"
PAUSE_IMAGE="localhost/custody/pause:1"
S3_PORT="${CUSTODY_S3_PORT:-19000}"
S3_CONSOLE_PORT="${CUSTODY_S3_CONSOLE_PORT:-19001}"
CUSTODY_S3_ACCESS_KEY="${CUSTODY_S3_ACCESS_KEY:-custody}"
CUSTODY_S3_SECRET_KEY="${CUSTODY_S3_SECRET_KEY:-custody-secret-key}"

log() { echo "[custody-hack] $*" >&2; }

# hold_lock FD WHAT: takes the lock open on FD, saying what it waits for when another run
# holds it (a build started in the background, another checkout's cluster).
hold_lock() {
  flock -n "$1" && return
  log "waiting for $2 (another run holds its lock; it is released when that run ends)"
  flock "$1"
  log "lock for $2 taken"
}

# install_missing TOOL:PACKAGE...: apt-get installs the package of each TOOL (a command, or an
# executable path) that is not there.
install_missing() {
  local tool missing=()
  for tool in "$@"; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || [[ -x "${tool%%:*}" ]] || missing+=("${tool##*:}")
  done
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then log "need root to apt-get install ${missing[*]}"; return 1; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# copy_libraries ROOT FILE...: copies into ROOT every shared library that the executables and
# modules under ROOT, and the FILEs, load, with the dynamic loader (an image with nothing else).
copy_libraries() {
  local root=$1 lib
  shift
  # ldd fails for scripts and static binaries: what it finds for the others is enough.
  { find "$root" "$@" -type f \( -perm -u+x -o -name '*.so' \) -print0 |
    xargs -0 ldd 2>/dev/null || true; } | awk '/=> \//{print $3} /^\s*\/lib/{print $1}' | sort -u |
    while read -r lib; do mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"; done
  mkdir -p "$root/lib64"
  cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
}

pidfile() { echo "$CLUSTER_DIR/$1.pid"; }

# running NAME: the PID file names a live process whose command line is NAME's binary.
# While a process execs, its command line reads empty for a moment (the kernel has installed
# the new memory map but not yet its arguments): a live process is asked again for up to 2 s
# before its PID file is taken for stale. (CI lost CoreDNS this way: `running coredns`, right
# after it started, read an empty command line and removed the PID file of a live daemon.)
running() {
  local file pid seen=
  file=$(pidfile "$1")
  [[ -s "$file" ]] || return 1
  pid=$(cat "$file")
  for _ in $(seq 40); do
    seen=$({ tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null || true)
    [[ "$seen" == *"$1"* ]] && return 0
    [[ -d "/proc/$pid" ]] || break
    sleep 0.05
  done
  log "removing stale PID file for $1 (pid $pid: ${seen:-no such process or no command line})"
  rm -f "$file"
  return 1
}

# start NAME BINARY ARGS...: starts BINARY detached, logging to logs/NAME.log.
start() {
  local name=$1 binary=$2 file pid=
  shift 2
  file=$(pidfile "$name")
  rm -f "$file"
  mkdir -p "$CLUSTER_DIR/logs"
  # The daemon writes its own PID file just before the exec: setsid forks when its caller
  # leads a process group (under job control), and then $! would be setsid's PID, gone at
  # once, while the daemon ran on unnamed.
  # 9>&-: the daemon must not inherit the lock cluster-up.sh holds on fd 9.
  setsid bash -c 'echo $$ > "$0"; exec "$@"' "$file" "$binary" "$@" \
    >"$CLUSTER_DIR/logs/$name.log" 2>&1 </dev/null 9>&- &
  # The daemon may take seconds to be scheduled on a loaded machine.
  for _ in $(seq 600); do
    [[ -s "$file" ]] && pid=$(cat "$file") && break
    sleep 0.05
  done
  log "started $name (pid ${pid:-unknown}, log $CLUSTER_DIR/logs/$name.log)"
}

# stop NAME: TERM, wait up to 10 s, then KILL.
stop() {
  local name=$1 pid
  running "$name" || return 0
  pid=$(cat "$(pidfile "$name")")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$(pidfile "$name")"
  log "stopped $name (pid $pid)"
}

stop_all() {
  stop kube-scheduler
  stop kube-controller-manager
  stop kube-apiserver
  stop etcd
}

kubectl_local() {
  "$CUSTODY_CACHE/bin/kubectl-$CUSTODY_KUBE_VERSION" --kubeconfig="$KUBECONFIG_PATH" "$@"
}

healthy() {
  [[ -s "$KUBECONFIG_PATH" ]] && kubectl_local get --raw /readyz >/dev/null 2>&1
}

# wait_for NAME COMMAND...: retries COMMAND for up to 120 s while process NAME is alive.
wait_for() {
  local name=$1
  shift
  for _ in $(seq 240); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! running "$name"; then
      log "$name exited; last lines of its log:"
      tail -n 30 "$CLUSTER_DIR/logs/$name.log" >&2 || true
      pgrep -af -- "$name" >&2 && log "(above: processes named $name still running)"
      return 1
    fi
    sleep 0.5
  done
  log "timed out waiting for $name; last lines of the logs:"
  tail -n 20 "$CLUSTER_DIR"/logs/*.log >&2 || true
  return 1
}

# bench_repository ENDPOINT BUCKET: creates custody's repository (prefix custody_repository) in
# BUCKET as the controller creates it, with the benchmarks' password, and prints its master key
# for CUSTODY_REPOSITORY_KEY. The test suite's debug repository-key does it: not what is timed.
bench_repository() {
  cargo build --locked -p custody-tests --bin repository-key --quiet >&2
  CUSTODY_REPOSITORY_PASSWORD=custody-bench "$CARGO_TARGET_DIR/debug/repository-key" "$1" "$2" custody_repository
}

# shipped_mover: builds custody-mover as the agent's image ships it (static, musl, profile
# image; hack/build-images.sh's build and cache) and prints its path. Benchmarks time this
# binary, not the host's build: musl's memcpy and mimalloc as built there are in its figures.
shipped_mover() {
  local target=x86_64-unknown-linux-musl
  install_missing musl-gcc:musl-tools
  rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
  cargo build --locked --profile image --target "$target" --target-dir "$CUSTODY_CACHE/image-target" \
    -p custody-controller -p custody-agent --bins --quiet >&2
  echo "$CUSTODY_CACHE/image-target/$target/image/custody-mover"
}
