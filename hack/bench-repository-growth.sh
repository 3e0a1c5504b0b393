#!/usr/bin/env bash
# How custody-mover's time and memory grow with its repository: STEPS backups into one
# repository on the local S3 server (MinIO), each of GIB_PER_STEP GiB of new generated data
# (three quarters random, one quarter compressible text, 64 MiB files, plus 5,000 small files)
# so that the repository grows by about that much every step; then a restore of the last
# snapshot from the full repository. Prints, per step, the repository's size and pack count
# before it, the backup's seconds, MiB/s and peak RSS. Not part of CI: the defaults write
# 20 GiB (about 25 minutes here, and 20 GiB of disk for MinIO and 5 GiB for the data).
#
#   hack/bench-repository-growth.sh [STEPS] [GIB_PER_STEP]     # defaults 5 and 4
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source hack/lib.sh
steps=${1:-5}
gib=${2:-4}

"$here/prerequisites.sh"
endpoint=$("$here/s3-up.sh" | tail -1)
mover=$(shipped_mover)   # static, musl: as the agent's image ships it
export AWS_ACCESS_KEY_ID=$CUSTODY_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$CUSTODY_S3_SECRET_KEY

work=$(mktemp -d /var/tmp/custody-bench-growth.XXXXXX)
bucket=bench-growth-$(date +%s)
trap 'rm -rf "$work"; "$here/s3.py" sweep "$endpoint" "$bucket" >&2' EXIT
"$here/s3.py" mb "$endpoint" "$bucket"
CUSTODY_REPOSITORY_KEY=$(bench_repository "$endpoint" "$bucket")
export CUSTODY_REPOSITORY_KEY
common=(--endpoint "$endpoint" --bucket "$bucket" --path-style --repository-prefix custody_repository)

# generate DIRECTORY STEP: GIB_PER_STEP GiB no earlier step wrote (a different seed each step).
generate() {
  python3 - "$1" "$2" "$gib" <<'PY'
import os, random, sys
root, step, gib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
random.seed(step)
words = [f"{step}-{word}".encode() for word in ("select", "insert", "orders", "customer", "NULL", "index")]
os.makedirs(os.path.join(root, "base"), exist_ok=True)
for index in range(5000):
    line = b" ".join(random.choice(words) for _ in range(12)) + b"\n"
    with open(os.path.join(root, "base", f"{index:05d}"), "wb") as f:
        f.write(line * (1 + index % 200))
os.makedirs(os.path.join(root, "wal"), exist_ok=True)
chunk = 64 << 20
for index in range(gib * 16):
    with open(os.path.join(root, "wal", f"{index:04d}"), "wb") as f:
        if index % 4 != 3:
            f.write(os.urandom(chunk))
        else:
            lines = [b" ".join(random.choice(words) for _ in range(12)) + b"\n" for _ in range(4096)]
            block = b"".join(lines)
            f.write((block * (chunk // len(block) + 1))[:chunk])
PY
}

printf '%-6s %14s %8s %10s %10s %14s\n' step "repo MiB" packs seconds MiB/s "peak RSS MiB"
snapshot="" hash="" uid=""
for step in $(seq 1 "$steps"); do
  rm -rf "$work/data"
  generate "$work/data" "$step"
  read -r packs bytes < <("$here/s3.py" du "$endpoint" "$bucket" custody_repository/data/)
  size_mib=$(du -sm "$work/data" | cut -f1)
  uid=growth-$step
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  start=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$work/rss" "$mover" backup "${common[@]}" --source "$work/data" \
    --backup-uid "$uid" --cluster-uid bench --volume data --claim data-bench-0 --backup-name "$uid" \
    --namespace bench --cluster bench --origin-cluster bench --consistency Stopped >"$work/out"
  end=$(date +%s.%N)
  seconds=$(echo "$end - $start" | bc -l)
  read -r snapshot hash < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["snapshot"]["id"], r["manifestHash"])' "$work/out")
  printf '%-6s %14d %8d %10.1f %10.1f %14.1f\n' "$step" $((bytes >> 20)) "$packs" "$seconds" \
    "$(echo "$size_mib / $seconds" | bc -l)" "$(echo "$(tail -1 "$work/rss") / 1024" | bc -l)"
done
read -r packs bytes < <("$here/s3.py" du "$endpoint" "$bucket" custody_repository/data/)
echo "repository after $steps steps: $((bytes >> 20)) MiB in $packs packs"

rm -rf "$work/data"; mkdir "$work/restore"
start=$(date +%s.%N)
/usr/bin/time -f "%M" -o "$work/rss" "$mover" restore "${common[@]}" --target "$work/restore" \
  --snapshot "$snapshot" --volume data --manifest-hash "$hash" --backup-uid "$uid" --restore-uid growth-restore >/dev/null
end=$(date +%s.%N)
seconds=$(echo "$end - $start" | bc -l)
size_mib=$(du -sm "$work/restore" | cut -f1)
printf 'restore of the last step (%d MiB) from the full repository: %.1f s, %.1f MiB/s, peak RSS %.1f MiB\n' \
  "$size_mib" "$seconds" "$(echo "$size_mib / $seconds" | bc -l)" "$(echo "$(tail -1 "$work/rss") / 1024" | bc -l)"
