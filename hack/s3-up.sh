#!/usr/bin/env bash
# Starts the local S3-compatible server (MinIO, built from the Go module proxy by
# hack/build-s3.sh) on loopback, and on the host address pods on a real node reach
# (http://$HOST_IP:$S3_PORT, hack/node-up.sh), or finds it running. Prints the endpoint URL last; the
# credentials are in hack/lib.sh (CUSTODY_S3_ACCESS_KEY / CUSTODY_S3_SECRET_KEY).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
endpoint="http://127.0.0.1:$S3_PORT"
mkdir -p "$CLUSTER_DIR"
exec 8>"$CLUSTER_DIR/s3.lock"
hold_lock 8 "the S3 server's start"
if running minio && curl -fs "$endpoint/minio/health/ready" >/dev/null; then
  if ! ip -4 addr show dev lo | grep -q "inet $HOST_IP/32" \
    || curl -fs "http://$HOST_IP:$S3_PORT/minio/health/ready" >/dev/null; then
    log "S3 server already running ($endpoint)"
    echo "$endpoint"
    exit 0
  fi
  log "S3 server not reachable at $HOST_IP: starting it again on every address"
  stop minio
fi
binary=$("$here/build-s3.sh" | tail -1)
mkdir -p "$CLUSTER_DIR/s3-data"
MINIO_ROOT_USER="$CUSTODY_S3_ACCESS_KEY" MINIO_ROOT_PASSWORD="$CUSTODY_S3_SECRET_KEY" \
MINIO_BROWSER=off MINIO_UPDATE=off \
  start minio "$binary" server "$CLUSTER_DIR/s3-data" --address ":$S3_PORT" \
    --console-address "127.0.0.1:$S3_CONSOLE_PORT" 8>&-
wait_for minio curl -fs "$endpoint/minio/health/ready"
log "S3 server up: $endpoint"
echo "$endpoint"
