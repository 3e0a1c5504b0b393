#!/usr/bin/env bash
# Builds Prometheus and promtool from the Go module proxy into
# ~/.cache/custody/bin/{prometheus,promtool}-<version>, once: promtool tests the alert rules of
# deploy/monitoring/, and the real-node tier scrapes custody with a real Prometheus. Prints
# the two binaries' paths on its last two lines (prometheus, then promtool).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
mkdir -p "$CUSTODY_CACHE/bin"
# One build at a time: hack/test.sh starts one beside tier 1, and a test that needs the
# binaries waits here for it rather than building them again.
exec 9>"$CUSTODY_CACHE/bin/.prometheus.lock"
hold_lock 9 "Prometheus' build"
prometheus="$CUSTODY_CACHE/bin/prometheus-$CUSTODY_PROMETHEUS_VERSION"
promtool="$CUSTODY_CACHE/bin/promtool-$CUSTODY_PROMETHEUS_VERSION"
if [[ -x "$prometheus" && -x "$promtool" ]]; then
  echo "$prometheus"
  echo "$promtool"
  exit 0
fi
log "building prometheus and promtool $CUSTODY_PROMETHEUS_VERSION from the Go module proxy (several minutes, once)"
# Built beside the binaries and renamed into place: a build killed midway leaves no binary
# that looks complete.
work=$(mktemp -d "$CUSTODY_CACHE/bin/.prometheus-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init custody.local/prometheus >&2
GOFLAGS=-mod=mod go get "github.com/prometheus/prometheus@$CUSTODY_PROMETHEUS_VERSION" >&2

for command in prometheus promtool; do
  # No web UI assets (they need npm): the HTTP API, which the tests use, is complete. No
  # service discovery but static and file targets (remove_all_sd): half the build.
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -tags remove_all_sd -trimpath -ldflags "-s -w" -o "$work/$command" \
    "github.com/prometheus/prometheus/cmd/$command"
done
mv "$work/prometheus" "$prometheus"
mv "$work/promtool" "$promtool"
echo "$prometheus"
echo "$promtool"
