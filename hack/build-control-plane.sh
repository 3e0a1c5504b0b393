#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (and any other
# command of k8s.io/kubernetes named as an argument) from the Go module proxy into a
# cache outside the repository, keyed by version. A second run finds the binaries and returns.
#
#   hack/build-control-plane.sh          # prints the bin directory on its last line
#   hack/build-control-plane.sh kubelet kube-proxy   # also these commands (hack/build-node.sh)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
names=(kube-apiserver kube-controller-manager kube-scheduler kubectl "$@")

KUBE_VERSION="$CUSTODY_KUBE_VERSION"
ETCD_VERSION="$CUSTODY_ETCD_VERSION"
BIN="$CUSTODY_CACHE/bin"
mkdir -p "$BIN"
# One build at a time: .ci/run starts one beside its lint checks, and cluster-up.sh waits here
# for it instead of building the same binaries again.
exec 7>"$BIN/.control-plane.lock"
hold_lock 7 "the control plane's build"

build_etcd() {
  local out="$BIN/etcd-$ETCD_VERSION"
  if [[ -x "$out" ]]; then return; fi
  log "building etcd $ETCD_VERSION (first run only)"
  local work; work=$(mktemp -d)
  (
    cd "$work"
    go mod init custody.local/etcd-build >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out.tmp" go.etcd.io/etcd/server/v3
  )
  mv "$out.tmp" "$out"
  rm -rf "$work"
}

build_kubernetes() {
  local name missing=()
  for name in "${names[@]}"; do
    [[ -x "$BIN/$name-$KUBE_VERSION" ]] || missing+=("$name")
  done
  ((${#missing[@]})) || return 0
  log "building ${missing[*]} $KUBE_VERSION (first run only)"
  local staging_version="v0.${KUBE_VERSION#v1.}"
  local work; work=$(mktemp -d)
  (
    cd "$work"
    go mod init custody.local/kubernetes-build >/dev/null 2>&1
    # k8s.io/kubernetes replaces its staging modules with local paths at v0.0.0; a consumer must
    # point each of them at the published release of the same minor/patch.
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod" \
      | awk '{print $1}' | sort -u | while read -r module; do
        go mod edit -replace "$module=$module@$staging_version"
      done
    {
      printf '//go:build tools\n\npackage tools\n\nimport (\n'
      for name in "${missing[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$name"; done
      printf ')\n'
    } > tools.go
    go mod edit -require "k8s.io/kubernetes@$KUBE_VERSION"
    # -e: tidy also walks the tests of dependencies, some of which import unpublished packages.
    go mod tidy -e >/dev/null 2>&1
    grep -q "k8s.io/kubernetes $KUBE_VERSION" go.mod || { log "go.mod lost k8s.io/kubernetes $KUBE_VERSION"; exit 1; }
    local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
    ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
    ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
    for name in "${missing[@]}"; do
      CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$BIN/$name-$KUBE_VERSION.tmp" "k8s.io/kubernetes/cmd/$name"
      mv "$BIN/$name-$KUBE_VERSION.tmp" "$BIN/$name-$KUBE_VERSION"
    done
  )
  rm -rf "$work"
}

build_etcd
build_kubernetes
echo "$BIN"
