#!/usr/bin/env bash
# Builds MinIO (the S3-compatible server tests and the demo use) from the Go module proxy into
# ~/.cache/custody/bin/minio-<version>, once; later runs reuse it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
binary="$CUSTODY_CACHE/bin/minio-$CUSTODY_MINIO_VERSION"
mkdir -p "$CUSTODY_CACHE/bin"
# One build at a time (.ci/run starts one beside its lint checks; s3-up.sh waits for it).
exec 7>"$CUSTODY_CACHE/bin/.minio.lock"
hold_lock 7 "MinIO's build"
if [[ -x "$binary" ]]; then
  echo "$binary"
  exit 0
fi
log "building MinIO $CUSTODY_MINIO_VERSION from the Go module proxy (several minutes, once)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
GOBIN="$work" GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" \
  "github.com/minio/minio@$CUSTODY_MINIO_VERSION"
mv "$work/minio" "$binary"
echo "$binary"
