#!/usr/bin/env bash
# Builds custody's two images from this repository, offline: static x86_64-unknown-linux-musl
# binaries (cargo profile `image`, target directory cached outside the repository), then
# images/controller.Containerfile and images/agent.Containerfile with buildah, tagged as
# deploy/ names them. Writes OCI archives and, with --import, loads them into the local node's
# containerd (hack/node-up.sh). Prints each image's size. With --binaries-only it stops after
# the binaries (hack/test.sh builds them beside its first tier).
#
#   hack/build-images.sh [--import]   # prints the archive directory on its last line
#   hack/build-images.sh --binaries-only   # prints nothing of its own on stdout
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
cd "$here/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
registry="${CUSTODY_IMAGE_REGISTRY:-ghcr.io/custody}"
target=x86_64-unknown-linux-musl
target_dir="$CUSTODY_CACHE/image-target"
out="$CUSTODY_CACHE/images"
mkdir -p "$out"

install_missing musl-gcc:musl-tools
rustup target list --installed | grep -qx "$target" || rustup target add "$target"

# Run from a test (cargo test sets CARGO_* for it), cargo would see another environment and
# build the cached target again: only the user's own cargo settings pass.
while read -r variable; do unset "$variable"; done < <(env | sed -n 's/^\(CARGO_[A-Z0-9_]*\)=.*/\1/p' | grep -vx 'CARGO_HOME\|CARGO_NET_OFFLINE\|CARGO_REGISTRIES_.*')
unset RUSTC RUSTDOC RUSTC_WRAPPER OUT_DIR
log "building static binaries ($target, profile image, target dir $target_dir)"
cargo build --locked --profile image --target "$target" --target-dir "$target_dir" \
  -p custody-controller -p custody-agent --bins
binaries="$target_dir/$target/image"
[[ "${1:-}" == "--binaries-only" ]] && exit 0
install_missing buildah:buildah

export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
for image in controller agent; do
  name="$registry/custody-$image:$version"
  archive="$out/custody-$image.tar"
  buildah build --quiet --layers=false -f "images/$image.Containerfile" -t "$name" "$binaries" >/dev/null
  rm -f "$archive"
  buildah push --quiet "$name" "oci-archive:$archive:$name"
  log "$name: $(du -k "$archive" | awk '{printf "%.1f MiB", $1 / 1024}') (archive $archive)"
  if [[ "${1:-}" == "--import" ]]; then
    ctr --address "$NODE_RUN/containerd.sock" -n k8s.io images import "$archive" >/dev/null
    log "imported $name into the node's containerd"
  fi
done
# The images these replaced, untagged now, would fill the disk (vfs copies every layer).
buildah rmi --prune >/dev/null || log "could not remove untagged images (buildah rmi --prune)"
echo "$out"
