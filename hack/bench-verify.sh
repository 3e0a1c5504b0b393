#!/usr/bin/env bash
# Verification throughput of custody against b3sum (the BLAKE3 reference CLI) on the same
# data, in the same run, with the same warm page cache: a few multi-GiB files, and 200k small
# files. Prints each figure and the ratio custody/b3sum (higher is better for custody).
#
#   hack/bench-verify.sh [LARGE_GIB_PER_FILE] [SMALL_FILES]     # defaults: 2 and 200000
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source hack/lib.sh
large_gib=${1:-2}
small_files=${2:-200000}

if ! command -v b3sum >/dev/null 2>&1; then
  log "installing b3sum with cargo install"
  cargo install --quiet --locked b3sum
fi
cargo bench -p custody-agent --bench verify --no-run --quiet 2>/dev/null

work=$(mktemp -d /var/tmp/custody-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/large" "$work/small"
log "writing 3 files of $large_gib GiB"
for index in 1 2 3; do
  head -c "$((large_gib << 30))" /dev/urandom > "$work/large/segment-$index"
done
log "writing $small_files small files"
python3 - "$work/small" "$small_files" <<'PY'
import os, sys
root, count = sys.argv[1], int(sys.argv[2])
for index in range(count):
    directory = os.path.join(root, f"{index // 1000:04d}")
    if index % 1000 == 0:
        os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{index:07d}.dat"), "wb") as f:
        f.write(os.urandom(512 + (index * 7919) % 7680))
PY

best_of_3() {  # best wall time in seconds of a command, run 3 times
  local best=999999 start end elapsed
  for _ in 1 2 3; do
    start=$(date +%s.%N); "$@" >/dev/null; end=$(date +%s.%N)
    elapsed=$(echo "$end - $start" | bc -l)
    if (( $(echo "$elapsed < $best" | bc -l) )); then best=$elapsed; fi
  done
  echo "$best"
}
b3sum_tree() { (cd "$1" && find . -type f ! -path './.custody/*' -print0 | xargs -0 b3sum); }

for set in large small; do
  cat "$work/$set"/* "$work/$set"/*/* > /dev/null 2>&1 || true   # warm the page cache for both
  b3=$(best_of_3 b3sum_tree "$work/$set")
  line=$(cargo bench -p custody-agent --bench verify --quiet -- "$work/$set" 2>/dev/null | grep '^custody-verify')
  custody=$(sed -n 's/.*best_seconds=\([0-9.]*\).*/\1/p' <<<"$line")
  echo "$set: $line"
  printf '%s: b3sum %.3f s, custody verify %.3f s, ratio custody/b3sum speed %.2fx\n' \
    "$set" "$b3" "$custody" "$(echo "$b3 / $custody" | bc -l)"
done
