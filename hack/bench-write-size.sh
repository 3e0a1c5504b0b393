#!/usr/bin/env bash
# How the size of each write call changes the cost of filling the page cache: writes the
# benchmark set's 1,936 MiB to one file from a 1 MiB and from an 8 MiB buffer, caches dropped
# before each, twice over, and prints the seconds of each. On a VM whose host takes back
# free memory (free page reporting), a long write's 2 MiB folios each fault in the host; the
# restore's extraction writes in calls of at most 1 MiB for this (`WRITE_BYTES` in
# agent/src/mover/extract.rs).
#
#   hack/bench-write-size.sh [DIRECTORY]     # default /var/tmp
set -euo pipefail
directory=${1:-/var/tmp}
file=$(mktemp "$directory/custody-write-size.XXXXXX")
trap 'rm -f "$file"' EXIT
for round in 1 2; do
  for size in $((1 << 20)) $((8 << 20)); do
    rm -f "$file"
    sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
    python3 - "$size" "$file" "$round" <<'PY'
import os, sys, time
size, path, round_ = int(sys.argv[1]), sys.argv[2], sys.argv[3]
buffer = os.urandom(size)
total = 1936 << 20
start = time.monotonic()
with open(path, "wb", buffering=0) as f:
    written = 0
    while written < total:
        f.write(buffer)
        written += size
print(f"round {round_}: {size >> 20} MiB writes: {time.monotonic() - start:.2f} s")
PY
  done
done
