#!/usr/bin/env bash
# Stops the local S3 server started by hack/s3-up.sh. --purge also removes its data.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
stop minio
if [[ "${1:-}" == "--purge" ]]; then
  rm -rf "$CLUSTER_DIR/s3-data"
  log "removed $CLUSTER_DIR/s3-data"
fi
