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

KUBE_VERSION="$CUSTODY_KUBE_VERSION"
BIN="$CUSTODY_CACHE/bin"
mkdir -p "$BIN"

build_node_kubernetes() {
  if [[ -x "$BIN/kubelet-$KUBE_VERSION" && -x "$BIN/kube-proxy-$KUBE_VERSION" ]]; then return; fi
  log "building kubelet and kube-proxy $KUBE_VERSION (first run only)"
  local staging_version="v0.${KUBE_VERSION#v1.}"
  local work; work=$(mktemp -d)
  (
    cd "$work"
    go mod init custody.local/node-build >/dev/null 2>&1
    # As in build-control-plane.sh: the staging modules point at their published releases.
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" \
      | awk '{print $1}' | sort -u | while read -r module; do
        go mod edit -replace "$module=$module@$staging_version"
      done
    cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
    go mod edit -require "k8s.io/kubernetes@$KUBE_VERSION"
    go mod tidy -e >/dev/null 2>&1
    local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
    ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
    ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
    local name
    for name in kubelet kube-proxy; do
      [[ -x "$BIN/$name-$KUBE_VERSION" ]] && continue
      CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$BIN/$name-$KUBE_VERSION.tmp" "k8s.io/kubernetes/cmd/$name"
      mv "$BIN/$name-$KUBE_VERSION.tmp" "$BIN/$name-$KUBE_VERSION"
    done
  )
  rm -rf "$work"
}

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

build_node_kubernetes
build_coredns
echo "$BIN"
