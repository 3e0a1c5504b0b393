#!/usr/bin/env bash
# Consistent capture of a running PostgreSQL at >= 1 GiB on the real node, each figure against a
# baseline measured in the same run: backup by pg_basebackup in custody's Job vs pg_basebackup
# to local disk alone; restore to a running database vs `cp -a` + `sync` of the same tree; the
# write stall (pgbench's longest transaction) during Tool and Freeze backups vs no backup.
#
#   hack/bench-consistency.sh            # CUSTODY_BENCH_SCALE=70 (pgbench scale, ~1.1 GB)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source hack/lib.sh
hack/prerequisites.sh
install_missing /usr/lib/postgresql/15/bin/pgbench:postgresql-15
hack/cluster-up.sh >/dev/null
hack/s3-up.sh >/dev/null
trap 'hack/node-down.sh' EXIT
hack/node-up.sh >/dev/null
cargo test -p custody-tests --test node --locked -- --ignored --exact \
  bench::on_a_real_node_bench_postgresql_consistency --nocapture 2>&1 |
  grep -E '^(consistent capture|  |test result)'
