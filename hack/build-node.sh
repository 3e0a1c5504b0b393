#!/usr/bin/env bash
# Builds what a real local node runs besides Debian's containerd and runc: kubelet and kube-proxy
# (the Kubernetes release the control plane runs) and CoreDNS (cluster DNS, only the plugins a
# node needs), from the Go module proxy into a cache outside the repository, keyed by version.
# A second run finds the binaries and returns.
#
#   hack/build-node.sh          # prints the bin directory on its last line
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

BIN="$CUSTODY_CACHE/bin"
mkdir -p "$BIN"
# One build at a time: hack/test.sh starts one in the background, node-up.sh waits for it.
exec 8>"$BIN/.node.lock"
hold_lock 8 "the node's build (kubelet, kube-proxy, CoreDNS, containerd)"

build_coredns() {
  local out="$BIN/coredns-$CUSTODY_COREDNS_VERSION"
  [[ -x "$out" ]] && return
  log "building CoreDNS $CUSTODY_COREDNS_VERSION (first run only)"
  local work; work=$(mktemp -d)
  (
    cd "$work"
    go mod init custody.local/coredns-build >/dev/null 2>&1
    # Only the plugins the node's Corefile (hack/node-up.sh) names, in CoreDNS's own order.
    cat > main.go <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	dnsserver.Directives = []string{"bind", "health", "ready", "errors", "cache", "kubernetes"}
	coremain.Run()
}
GO
    go mod edit -require "github.com/coredns/coredns@$CUSTODY_COREDNS_VERSION"
    go mod tidy >/dev/null 2>&1
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out.tmp" .
  )
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

"$here/build-control-plane.sh" kubelet kube-proxy >/dev/null
build_coredns
echo "$BIN"
