#!/usr/bin/env bash
# Builds helm (the chart in deploy/helm/custody is installed with it) from the Go module proxy
# into ~/.cache/custody/bin/helm-<version>, once; prints the binary's path on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
binary="$CUSTODY_CACHE/bin/helm-$CUSTODY_HELM_VERSION"
mkdir -p "$CUSTODY_CACHE/bin"
# One build at a time: hack/test.sh starts one in the background, the helm tests wait for it.
exec 8>"$CUSTODY_CACHE/bin/.helm.lock"
hold_lock 8 "helm's build"
if [[ -x "$binary" ]]; then
  echo "$binary"
  exit 0
fi
mkdir -p "$CUSTODY_CACHE/bin"
log "building helm $CUSTODY_HELM_VERSION from the Go module proxy (a few minutes, once)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
go mod init custody.local/helm >/dev/null 2>&1
GOFLAGS=-mod=mod go get "helm.sh/helm/v3@$CUSTODY_HELM_VERSION" >/dev/null 2>&1
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$work/helm" helm.sh/helm/v3/cmd/helm
mv "$work/helm" "$binary"
echo "$binary"
