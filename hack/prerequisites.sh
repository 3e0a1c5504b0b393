#!/usr/bin/env bash
# Installs what custody's scripts need on a fresh Debian machine: Debian packages through apt
# (when a tool is missing), and checks that Go and the pinned Rust toolchain are there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

install_missing openssl:openssl curl:curl flock:util-linux setsid:util-linux base64:coreutils bc:bc \
  python3:python3 mkfs.ext4:e2fsprogs protoc:protobuf-compiler faketime:faketime restic:restic

command -v go >/dev/null 2>&1 || { log "Go is required to build the control plane (https://go.dev/dl)"; exit 1; }
command -v cargo >/dev/null 2>&1 || { log "Rust (rustup) is required"; exit 1; }
# rust-toolchain.toml pins the toolchain; this installs it if rustup can.
(cd "$here/.." && cargo --version >/dev/null)
