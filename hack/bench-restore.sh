#!/usr/bin/env bash
# Restore-to-ready of a ~1 GiB volume through the whole system, split into download + extract,
# verification and the rest, against a plain `cp -a` + `sync` measured in the same run.
#
#   hack/bench-restore.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
hack/prerequisites.sh
hack/cluster-up.sh >/dev/null
hack/s3-up.sh >/dev/null
cargo build --workspace --bins --locked --release
cargo bench -p custody-tests --bench restore --locked
