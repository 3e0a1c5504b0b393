#!/usr/bin/env bash
# Builds the PostgreSQL image the real-node tests and the demo run as the application custody
# protects: Debian's postgresql-15 binaries (server, psql, pgbench, pg_amcheck, pg_checksums,
# pg_basebackup, ...) with exactly the shared libraries they load, a shell for the start
# script, and nothing else. No image is pulled: it is assembled from this machine's packages
# (`buildah from scratch`), tagged localhost/custody/postgres:15. Cached by the package
# version; with --import, loaded into the local node's containerd (hack/node-up.sh).
#
# The image runs as uid 999 (postgres). Its start script (images/postgres/start) creates a
# cluster with data checksums in $PGDATA when the directory holds none, then runs postgres.
#
#   hack/build-postgres-image.sh [--import]     # prints the image name on its last line
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
cd "$here/.."

name=localhost/custody/postgres:15
pg=/usr/lib/postgresql/15
install_missing "$pg/bin/postgres:postgresql-15" "$pg/bin/psql:postgresql-client-15" buildah:buildah
version=$(dpkg-query -W -f '${Version}' postgresql-15)
out="$CUSTODY_CACHE/images"
archive="$out/postgres-15.tar"
stamp="$out/postgres-15.version"
mkdir -p "$out"

if [[ ! -s "$archive" || "$(cat "$stamp" 2>/dev/null)" != "$version $(sha256sum images/postgres/start | cut -c1-16)" ]]; then
  log "assembling $name from Debian's postgresql-15 $version"
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  mkdir -p "$root"/{bin,tmp,etc,usr/share/zoneinfo/Etc,var/lib/postgresql}
  chmod 1777 "$root/tmp"
  mkdir -p "$root$pg/lib" "$root/usr/share/postgresql"
  cp -a "$pg/bin" "$root$pg/"
  # Extensions and encoding conversions, without the LLVM JIT (its bitcode is most of the
  # size; jit is off in this image).
  find "$pg/lib" -maxdepth 1 -name '*.so' ! -name 'llvmjit*' -exec cp -a -t "$root$pg/lib" {} +
  cp -a /usr/share/postgresql/15 "$root/usr/share/postgresql/"
  cp -a /usr/share/zoneinfo/UTC "$root/usr/share/zoneinfo/"
  cp -a /usr/share/zoneinfo/Etc/UTC "$root/usr/share/zoneinfo/Etc/"
  cp -L /bin/dash "$root/bin/sh"
  # Every shared library the binaries and modules load, with the dynamic loader.
  copy_libraries "$root" /bin/dash
  install -m 0755 images/postgres/start "$root/bin/postgres-start"
  printf 'root:x:0:0:root:/:/bin/sh\npostgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/sh\n' > "$root/etc/passwd"
  printf 'root:x:0:\npostgres:x:999:\n' > "$root/etc/group"

  export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
  container=$(buildah from scratch)
  buildah copy --quiet "$container" "$root" / >/dev/null
  buildah config --env "PATH=$pg/bin:/bin" --env PGDATA=/var/lib/postgresql/data/pgdata \
    --env PGHOST=/tmp --env PGUSER=postgres --env TZ=UTC --env LANG=C \
    --user 999:999 --port 5432 --entrypoint '["/bin/postgres-start"]' "$container"
  buildah commit --quiet --rm "$container" "$name" >/dev/null
  rm -f "$archive"
  buildah push --quiet "$name" "oci-archive:$archive:$name"
  echo "$version $(sha256sum images/postgres/start | cut -c1-16)" > "$stamp"
fi
log "$name: $(du -k "$archive" | awk '{printf "%.1f MiB", $1 / 1024}') (archive $archive)"
if [[ "${1:-}" == "--import" ]]; then
  ctr --address "$NODE_RUN/containerd.sock" -n k8s.io images import "$archive" >/dev/null
  log "imported $name into the node's containerd"
fi
echo "$name"
