#!/usr/bin/env bash
# Builds kopia (the uploader the most used Kubernetes backup tool runs) from the Go module
# proxy into ~/.cache/custody/bin/kopia-<version>, once, for hack/bench-mover.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
binary="$CUSTODY_CACHE/bin/kopia-$CUSTODY_KOPIA_VERSION"
if [[ -x "$binary" ]]; then
  echo "$binary"
  exit 0
fi
mkdir -p "$CUSTODY_CACHE/bin"
log "building kopia $CUSTODY_KOPIA_VERSION from the Go module proxy (several minutes, once)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A consumer module: `go install module@version` asks the proxy for the module's version list
# (to report deprecation), which it refuses for kopia; exact versions are served.
cd "$work"
go mod init custody.local/kopia >/dev/null 2>&1
GOFLAGS=-mod=mod go get "github.com/kopia/kopia@$CUSTODY_KOPIA_VERSION" >/dev/null 2>&1
GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$work/kopia" github.com/kopia/kopia
mv "$work/kopia" "$binary"
echo "$binary"
