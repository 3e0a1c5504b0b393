#!/usr/bin/env bash
# The prune property tests at full size: 100,000 generated histories of backups, forgets,
# prunes and time passing against real (in-memory) repositories, optimised (the bench
# profile: release without whole-program LTO). CI runs 300 in the test suite.
#   hack/prune-properties.sh [CASES] [FIRST_SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/lib.sh
export CARGO_TARGET_DIR
export CUSTODY_PRUNE_CASES="${1:-100000}" CUSTODY_PRUNE_SEED="${2:-1}"
cargo test --profile bench --locked -p custody-repository --test prune_properties \
    -- --nocapture --test-threads 1
