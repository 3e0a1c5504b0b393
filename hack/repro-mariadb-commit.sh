#!/usr/bin/env bash
# Issue 24 item 2's MariaDB report, reproduced on the real node: a mariadb-backup Tool backup
# under a mixed load (InnoDB transfers, Aria and MyISAM writes, an ALTER TABLE loop), then a
# minute of watching the source's commits. Repeat with CUSTODY_REPRO_RUNS (default 1).
#
#   hack/repro-mariadb-commit.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source hack/lib.sh
hack/prerequisites.sh
hack/cluster-up.sh >/dev/null
hack/s3-up.sh >/dev/null
trap 'hack/node-down.sh' EXIT
hack/node-up.sh >/dev/null
hack/build-images.sh --import >/dev/null
for run in $(seq "${CUSTODY_REPRO_RUNS:-1}"); do
  echo "run $run"
  cargo test -p custody-tests --test node --locked -- --ignored --exact \
    mariadb::on_a_real_node_mariadb_commits_go_on_after_a_mariadb_backup_under_a_mixed_load --nocapture 2>&1 |
    grep -E -A12 '^(the mariadb|commits|look|InnoDB|process|test result|thread)' || true
done
