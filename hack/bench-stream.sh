#!/usr/bin/env bash
# The streamed Tool backup's own speed, without Kubernetes: a local PostgreSQL (pgbench scale
# CUSTODY_BENCH_SCALE, default 70, ~1.1 GB), `pg_basebackup -F tar -D -` written into the
# mover's FIFO and read by the shipped custody-mover into a fresh repository on the local S3
# server, exactly as in a Tool backup's Job (stream-setup, stream-tool, backup --tar-stream),
# against the baseline of hack/bench-consistency.sh measured in the same run (`pg_basebackup
# -X stream -c fast -D DIR` to local disk alone), alternating, CUSTODY_BENCH_RUNS times each
# (default 3). Prints each run's seconds and the whole machine's CPU seconds (user, system,
# idle) over it: where the cores are busy, the figure is bounded by the work, not by waits.
#
#   hack/bench-stream.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
source hack/lib.sh
scale=${CUSTODY_BENCH_SCALE:-70}
runs=${CUSTODY_BENCH_RUNS:-3}
pg=/usr/lib/postgresql/15/bin
"$here/prerequisites.sh"
install_missing "$pg/pgbench:postgresql-15"
endpoint=$("$here/s3-up.sh" | tail -1)
mover=$(shipped_mover)
export AWS_ACCESS_KEY_ID=$CUSTODY_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$CUSTODY_S3_SECRET_KEY

work=$(mktemp -d /var/tmp/custody-bench-stream.XXXXXX)
chown postgres "$work"
port=25439
as_postgres() { runuser -u postgres -- "$@"; }
stop_pg() { as_postgres "$pg/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1 || true; }
run=$(date +%s)
trap 'stop_pg; rm -rf "$work"; "$here/s3.py" sweep "$endpoint" "bench-stream-$run-.*" >&2' EXIT
log "a local PostgreSQL, pgbench scale $scale"
as_postgres "$pg/initdb" -D "$work/data" -A trust >/dev/null
as_postgres "$pg/pg_ctl" -D "$work/data" -l "$work/postgres.log" -w \
  -o "-p $port -k $work -c wal_keep_size=2GB -c max_wal_senders=4 -c listen_addresses=''" start >/dev/null
as_postgres "$pg/pgbench" -h "$work" -p "$port" -i -s "$scale" -q postgres >/dev/null 2>&1
as_postgres "$pg/psql" -h "$work" -p "$port" -qAtc checkpoint postgres
size=$(as_postgres "$pg/psql" -h "$work" -p "$port" -Atc 'select pg_database_size(current_database())' postgres)

# measured LABEL COMMAND...: prints "LABEL seconds user system idle" (whole machine, CPU s)
measured() {
  local label=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  local u1 n1 s1 i1 w1 q1 sq1 u2 n2 s2 i2 w2 q2 sq2 start end
  read -r _ u1 n1 s1 i1 w1 q1 sq1 _ < /proc/stat
  start=$(date +%s.%N)
  "$@"
  end=$(date +%s.%N)
  read -r _ u2 n2 s2 i2 w2 q2 sq2 _ < /proc/stat
  local hz; hz=$(getconf CLK_TCK)
  printf '%s %.3f %.2f %.2f %.2f\n' "$label" "$(echo "$end - $start" | bc -l)" \
    "$(echo "($u2 + $n2 - $u1 - $n1) / $hz" | bc -l)" "$(echo "($s2 + $q2 + $sq2 - $s1 - $q1 - $sq1) / $hz" | bc -l)" \
    "$(echo "($i2 + $w2 - $i1 - $w1) / $hz" | bc -l)"
}

baseline() {
  rm -rf "$work/base"
  as_postgres "$pg/pg_basebackup" -h "$work" -p "$port" -X stream -c fast -D "$work/base"
}

# prepare INDEX: a fresh bucket, repository and FIFO for a streamed run (not timed).
prepare() {
  local bucket=bench-stream-$run-$1 dir=$work/stream-$1
  mkdir -m 755 "$dir"
  "$here/s3.py" mb "$endpoint" "$bucket" >/dev/null
  bench_repository "$endpoint" "$bucket" >"$dir.key"
  "$mover" stream-setup --dir "$dir"
}

streamed() {
  local bucket=bench-stream-$run-$1 dir=$work/stream-$1
  as_postgres "$dir/custody-mover" stream-tool --dir "$dir" -- \
    "$pg/pg_basebackup" -h "$work" -p "$port" -X fetch -c fast -F tar -D - >/dev/null 2>"$work/tool.err" &
  local tool=$!
  if ! CUSTODY_REPOSITORY_KEY=$(cat "$dir.key") "$mover" backup --endpoint "$endpoint" \
    --bucket "$bucket" --path-style --repository-prefix custody_repository --tar-stream "$dir" \
    --tar-data-path pgdata --source "$dir" --backup-uid "bench-$1" --cluster-uid bench \
    --volume data --claim data-bench-0 --backup-name "bench-$1" --namespace bench --cluster bench \
    --origin-cluster bench --consistency Tool >"$work/mover.out" 2>"$work/mover.err"; then
    tail -3 "$work/mover.err" "$work/tool.err" >&2
    kill "$tool" 2>/dev/null || true
    return 1
  fi
  wait "$tool"
}

results=()
for index in $(seq "$runs"); do
  prepare "$index"
  results+=("$(measured baseline baseline)")
  results+=("$(measured streamed streamed "$index")")
done
stored=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sizeBytes"])' "$work/mover.out")

echo
echo "database: $size bytes (pgbench scale $scale); the streamed backup stored $stored bytes"
printf '%-10s %9s %11s %11s %11s\n' run seconds "user CPU s" "sys CPU s" "idle CPU s"
for line in "${results[@]}"; do
  read -r label seconds user system idle <<<"$line"
  printf '%-10s %9s %11s %11s %11s\n' "$label" "$seconds" "$user" "$system" "$idle"
done
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
pick() { for line in "${results[@]}"; do read -r l s _ <<<"$line"; [[ $l == "$1" ]] && echo "$s"; done; }
base=$(median $(pick baseline))
stream=$(median $(pick streamed))
printf 'streamed Tool backup without Kubernetes: x%.2f the speed of pg_basebackup to local disk (medians %s s and %s s; #24 asks x0.8 of the whole Backup)\n' \
  "$(echo "$base / $stream" | bc -l)" "$stream" "$base"
