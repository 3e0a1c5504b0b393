#!/usr/bin/env bash
# Backup and restore of the same ~2 GiB mixed data set to the same local S3 server (MinIO) with
# custody-mover (its encrypted repository, restic's format), restic (Debian's package) and
# kopia (built from the Go module proxy by hack/build-kopia.sh), in one run, all three
# encrypting; custody's restore figure includes its verification, and custody's and restic's
# restores are each the median of three alternating runs. Then custody's second
# backup of the unchanged set (the median of three runs), and one after 1% of the files
# changed. Prints seconds, MiB/s, peak RSS, uploaded bytes and ratios (other tool's time /
# custody's time: above 1 means custody is faster).
#
#   hack/bench-mover.sh [SMALL_FILES] [LARGE_MIB_TOTAL]     # defaults 40000 and 1536
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source hack/lib.sh
small_files=${1:-40000}
large_mib=${2:-1536}

"$here/prerequisites.sh"
command -v restic >/dev/null || { log "installing restic"; apt-get install -y -qq restic >/dev/null; }
endpoint=$("$here/s3-up.sh" | tail -1)
mover=$(shipped_mover)   # static, musl: as the agent's image ships it
kopia=$("$here/build-kopia.sh" | tail -1)
export AWS_ACCESS_KEY_ID=$CUSTODY_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$CUSTODY_S3_SECRET_KEY
export RESTIC_PASSWORD=custody-bench

work=$(mktemp -d /var/tmp/custody-bench-mover.XXXXXX)
trap 'rm -rf "$work"' EXIT
log "writing the data set: $small_files small files and $large_mib MiB of large files"
python3 - "$work/data" "$small_files" "$large_mib" <<'PY'
import os, random, sys
root, count, large_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
random.seed(7)
words = [b"select", b"insert", b"orders", b"customer", b"2026-11-30", b"NULL", b"committed", b"index"]
for index in range(count):
    directory = os.path.join(root, "base", f"{index // 1000:04d}")
    if index % 1000 == 0:
        os.makedirs(directory, exist_ok=True)
    size = 512 + (index * 7919) % 15872
    line = b" ".join(random.choice(words) for _ in range(16)) + b"\n"
    with open(os.path.join(directory, f"{index:07d}"), "wb") as f:
        f.write((line * (size // len(line) + 1))[:size])
os.makedirs(os.path.join(root, "pg_wal"), exist_ok=True)
chunk = 64 << 20
for index in range(large_mib // 64):
    with open(os.path.join(root, "pg_wal", f"segment-{index:03d}"), "wb") as f:
        # Half random (incompressible), half text (compressible), as database files are.
        if index % 2 == 0:
            f.write(os.urandom(chunk))
        else:
            line = b" ".join(random.choice(words) for _ in range(16)) + b"\n"
            f.write((line * (chunk // len(line) + 1))[:chunk])
PY
total_mib=$(du -sm "$work/data" | cut -f1)
log "data set: $total_mib MiB"

run=$(date +%s)
# This run's buckets (about 3 GB each) go with it.
trap 'umount "$work/restores" 2>/dev/null || true; rm -rf "$work"; "$here/s3.py" sweep "$endpoint" "bench-(custody|kopia|restic)-$run" >&2' EXIT
"$here/s3.py" mb "$endpoint" "bench-custody-$run"
"$here/s3.py" mb "$endpoint" "bench-restic-$run"
"$here/s3.py" mb "$endpoint" "bench-kopia-$run"

# timed LABEL COMMAND...: prints "LABEL seconds peak_rss_mib"
timed() {
  local label=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  cat "$work"/data/pg_wal/* >/dev/null 2>&1 || true   # same warm cache for both tools
  local start end rss
  start=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$work/rss" "$@" >"$work/$label.out" 2>"$work/$label.err" || { cat "$work/$label.err" >&2; return 1; }
  end=$(date +%s.%N)
  rss=$(tail -1 "$work/rss")
  printf '%s %.3f %.1f\n' "$label" "$(echo "$end - $start" | bc -l)" "$(echo "$rss / 1024" | bc -l)"
}

uid=bench-$run
results=()
# The repository, created as the controller creates it; the mover opens it with its master key.
CUSTODY_REPOSITORY_KEY=$(bench_repository "$endpoint" "bench-custody-$run")
export CUSTODY_REPOSITORY_KEY
common=(--endpoint "$endpoint" --bucket "bench-custody-$run" --path-style --repository-prefix custody_repository)
# Arrays are not exported: the functions below run in `bash -c` and rebuild it.
export common_flat="${common[*]}"
snapshot_backup() { # snapshot_backup BACKUP_UID [PARENT]
  local common=($common_flat)
  "$mover" backup "${common[@]}" --source "$work/data" --backup-uid "$1" --cluster-uid bench \
    --volume data --claim data-bench-0 --backup-name "$1" --namespace bench --cluster bench \
    --origin-cluster bench --consistency Stopped ${2:+--parent "$2"}
}
export -f snapshot_backup; export mover work
results+=("$(timed custody-backup bash -c "snapshot_backup $uid")")
read -r snapshot hash uploaded < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["snapshot"]["id"], r["manifestHash"], r["sizeBytes"])' "$work/custody-backup.out")
# Every restore goes into a new directory of a new ext4 filesystem (mkfs's defaults: with a
# journal, as a new volume's), none deleted before the run ends. Restored straight into a
# filesystem without a journal where files were deleted in the last minutes (this machine's
# root, after an earlier run's cleanup), ext4 passes over each recently deleted inode in turn
# (recently_deleted, in ext4_create): custody's restore took 5.1-5.4 s there, 4.2-4.8 s not.
truncate -s 32G "$work/restores.img"
mkfs.ext4 -q -F "$work/restores.img"
mkdir "$work/restores"
mount -o loop "$work/restores.img" "$work/restores"
restores=0
new_target() { restores=$((restores + 1)); target="$work/restores/$restores"; mkdir "$target"; }
restore_and_verify() {
  "$mover" restore "${common[@]}" --target "$target" --snapshot "$snapshot" --volume data \
    --manifest-hash "$hash" --backup-uid "$uid" --restore-uid bench-restore &&
  "$mover" verify --target "$target" --manifest-hash "$hash" --backup-uid "$uid" \
    --restore-uid bench-restore
}
export -f restore_and_verify; export work snapshot hash uid endpoint run mover
restore_and_verify_flat() { common=($common_flat); restore_and_verify; }
export -f restore_and_verify_flat
repo="s3:$endpoint/bench-restic-$run"
restic -r "$repo" init >/dev/null
results+=("$(timed restic-backup restic -r "$repo" backup "$work/data")")
# The restore figure: one run here moves by a tenth from the next, so each tool's is the
# median of three, custody's and restic's runs alternating.
# median LINE...: of three "LABEL seconds rss" lines, the label, the middle time and the
# highest peak RSS
median() {
  local middle highest
  middle=$(printf '%s\n' "$@" | sort -k2,2n | sed -n 2p)
  highest=$(printf '%s\n' "$@" | sort -k3,3n | tail -1 | cut -d' ' -f3)
  echo "${middle% *} $highest"
}
custody_restores=() restic_restores=()
for _ in 1 2 3; do
  new_target; export target
  custody_restores+=("$(timed custody-restore-verify bash -c restore_and_verify_flat)")
  new_target
  restic_restores+=("$(timed restic-restore restic -r "$repo" restore latest --target "$target")")
done
results+=("$(median "${custody_restores[@]}")" "$(median "${restic_restores[@]}")")
new_target
results+=("$(timed restic-restore-verify restic -r "$repo" restore latest --verify --target "$target")")
# custody's restore ends with syncfs of its target (the data is on disk before the pod may
# start); restic does not sync. The same durability for restic: restore, verify, sync -f.
new_target; export target
restic_durable() { restic -r "$repo" restore latest --verify --target "$target" && sync -f "$target"; }
export -f restic_durable; export repo
results+=("$(timed restic-restore-verify-sync bash -c restic_durable)")

# kopia: a fresh repository and cache for the backup; the restore starts from an empty cache
# too, as on a fresh node.
export KOPIA_PASSWORD=custody-bench KOPIA_CHECK_FOR_UPDATES=false
kopia_flags=(--config-file "$work/kopia.config" --log-dir "$work/kopia-logs")
"$kopia" "${kopia_flags[@]}" repository create s3 --cache-directory "$work/kopia-cache" --bucket "bench-kopia-$run" \
  --endpoint "${endpoint#http://}" --disable-tls --access-key "$AWS_ACCESS_KEY_ID" \
  --secret-access-key "$AWS_SECRET_ACCESS_KEY" >/dev/null 2>&1
results+=("$(timed kopia-backup "$kopia" "${kopia_flags[@]}" snapshot create "$work/data")")
root=$("$kopia" "${kopia_flags[@]}" snapshot list "$work/data" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[-1]["rootEntry"]["obj"])')
"$kopia" "${kopia_flags[@]}" cache clear >/dev/null
new_target
results+=("$(timed kopia-restore "$kopia" "${kopia_flags[@]}" snapshot restore "$root" "$target")")
# Again with the cache the first restore filled: kopia's best case.
new_target
results+=("$(timed kopia-restore-cached "$kopia" "${kopia_flags[@]}" snapshot restore "$root" "$target")")

# Incremental: the same data again, then with 1% of the files rewritten.
second_backup() { common=($common_flat); snapshot_backup "$uid-2" "$snapshot"; }
export -f second_backup
# Under a second: one run moves by a sixth from the next here, so the figure is the median of
# three (each a snapshot of the same data with the same parent).
unchanged=()
for _ in 1 2 3; do unchanged+=("$(timed custody-backup-unchanged bash -c second_backup)"); done
results+=("$(median "${unchanged[@]}")")
uploaded_unchanged=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sizeBytes"])' "$work/custody-backup-unchanged.out")
second=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["snapshot"]["id"])' "$work/custody-backup-unchanged.out")
python3 - "$work/data" <<'PY'
import os, sys
root = sys.argv[1]
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
for path in files[::100]:
    with open(path, "r+b") as f:
        f.write(b"changed")
PY
changed=$(python3 -c 'import os,sys; print(len(sorted(os.path.join(d,f) for d,_,fs in os.walk(sys.argv[1]) for f in fs)[::100]))' "$work/data")
third_backup() { common=($common_flat); snapshot_backup "$uid-3" "$second"; }
export -f third_backup; export second
results+=("$(timed custody-backup-1pct bash -c third_backup)")
uploaded_changed=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sizeBytes"])' "$work/custody-backup-1pct.out")

echo
echo "data set: $total_mib MiB ($small_files small files + $large_mib MiB in 64 MiB files, half random)"
printf '%-24s %10s %10s %14s\n' tool seconds MiB/s "peak RSS MiB"
for line in "${results[@]}"; do
  read -r label seconds rss <<<"$line"
  printf '%-24s %10s %10.1f %14s\n' "$label" "$seconds" "$(echo "$total_mib / $seconds" | bc -l)" "$rss"
done
get() { for line in "${results[@]}"; do read -r l s _ <<<"$line"; [[ $l == "$1" ]] && echo "$s"; done; }
volume_bytes=$(du -sb "$work/data" | cut -f1)
printf 'backup:  restic/custody time %.2fx (target >= 1.5x)\n' "$(echo "$(get restic-backup) / $(get custody-backup)" | bc -l)"
printf 'backup of unchanged data: %.1fx faster than the first (target >= 20x), uploaded %d bytes = %.3f%% of the volume (target < 1%%)\n' \
  "$(echo "$(get custody-backup) / $(get custody-backup-unchanged)" | bc -l)" "$uploaded_unchanged" "$(echo "100 * $uploaded_unchanged / $volume_bytes" | bc -l)"
printf 'backup after %d files (1%%) changed: uploaded %d bytes = %.2f%% of the volume (target <= 3%%)\n' \
  "$changed" "$uploaded_changed" "$(echo "100 * $uploaded_changed / $volume_bytes" | bc -l)"
printf 'restore: restic (no verify)/custody (restore+verify) time %.2fx (target >= 1.5x)\n' "$(echo "$(get restic-restore) / $(get custody-restore-verify)" | bc -l)"
printf 'restore runs (seconds, each the median of these three): custody %s; restic %s\n' \
  "$(printf '%s\n' "${custody_restores[@]}" | cut -d' ' -f2 | paste -sd' ')" "$(printf '%s\n' "${restic_restores[@]}" | cut -d' ' -f2 | paste -sd' ')"
printf 'restore: restic --verify/custody (restore+verify) time %.2fx\n' "$(echo "$(get restic-restore-verify) / $(get custody-restore-verify)" | bc -l)"
printf 'restore: restic --verify + sync/custody (restore+sync+verify) time %.2fx (same durability)\n' "$(echo "$(get restic-restore-verify-sync) / $(get custody-restore-verify)" | bc -l)"
printf 'backup:  kopia/custody time %.2fx (target >= 2x)\n' "$(echo "$(get kopia-backup) / $(get custody-backup)" | bc -l)"
printf 'restore: kopia (no verify)/custody (restore+verify) time %.2fx (target >= 2x)\n' "$(echo "$(get kopia-restore) / $(get custody-restore-verify)" | bc -l)"
printf 'restore: kopia with its cache filled/custody (restore+verify) time %.2fx\n' "$(echo "$(get kopia-restore-cached) / $(get custody-restore-verify)" | bc -l)"
