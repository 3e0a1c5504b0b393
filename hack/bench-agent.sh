#!/usr/bin/env bash
# Agent benchmarks against the local control plane: gate release latency (p50/p99 over 100
# pods, against a once-a-second marker-file poll measured in the same run) and the agent's
# idle memory and CPU (against `kubectl get pods --watch` on the same pods).
#
#   hack/bench-agent.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source hack/lib.sh
"$here/prerequisites.sh"
"$here/cluster-up.sh" >/dev/null
# The benchmark runs the release binaries it measures.
cargo build --locked --release --bins --quiet
cargo bench --locked -p custody-tests --bench agent --quiet
