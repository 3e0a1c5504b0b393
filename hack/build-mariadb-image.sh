#!/usr/bin/env bash
# Builds the MariaDB image the real-node tests run as an application custody protects:
# Debian's MariaDB 10.11 server, client, mariadb-backup and mariadb-check with exactly the
# shared libraries they load, BusyBox for the shell and tools mariadb-install-db uses, and
# nothing else. No image is pulled: it is assembled from this machine's packages
# (`buildah from scratch`), tagged localhost/custody/mariadb:10.11. Cached by the package
# version and the start script; with --import, loaded into the local node's containerd
# (hack/node-up.sh).
#
# The image runs as uid 999 (mysql). Its start script (images/mariadb/start) creates a
# database in $MARIADB_DATA when the directory holds none, then runs mariadbd; clients in the
# container reach it on the socket /tmp/mysqld.sock.
#
#   hack/build-mariadb-image.sh [--import]     # prints the image name on its last line
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
cd "$here/.."

name=localhost/custody/mariadb:10.11
install_missing /usr/sbin/mariadbd:mariadb-server mariadb-backup:mariadb-backup \
  /bin/busybox:busybox-static buildah:buildah
version=$(dpkg-query -W -f '${Version}' mariadb-server)
out="$CUSTODY_CACHE/images"
archive="$out/mariadb-10.11.tar"
stamp="$out/mariadb-10.11.version"
mkdir -p "$out"
want="$version $(sha256sum images/mariadb/start hack/build-mariadb-image.sh | sha256sum | cut -c1-16)"

if [[ ! -s "$archive" || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  log "assembling $name from Debian's mariadb-server $version"
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  mkdir -p "$root"/{bin,tmp,etc,usr/bin,usr/sbin,usr/share/mysql,var/lib/mysql}
  chmod 1777 "$root/tmp"
  cp -a /usr/sbin/mariadbd "$root/usr/sbin/"
  for tool in mariadb mariadb-admin mariadb-backup mariadb-check mariadb-install-db \
    my_print_defaults resolveip; do
    cp -L "/usr/bin/$tool" "$root/usr/bin/"
  done
  # The SQL that creates a database, English messages and the character sets.
  cp -a /usr/share/mysql/*.sql /usr/share/mysql/english /usr/share/mysql/charsets \
    "$root/usr/share/mysql/"
  cp /bin/busybox "$root/bin/"
  for applet in sh sed awk cat hostname chown chmod dirname basename mkdir rm sleep ls cp \
    mv grep tail head test id env; do
    ln -s busybox "$root/bin/$applet"
  done
  copy_libraries "$root"
  printf 'root:x:0:0:root:/:/bin/sh\nmysql:x:999:999:MariaDB:/var/lib/mysql:/bin/sh\n' > "$root/etc/passwd"
  printf 'root:x:0:\nmysql:x:999:\n' > "$root/etc/group"
  install -m 0755 images/mariadb/start "$root/bin/mariadb-start"

  export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
  container=$(buildah from scratch)
  buildah copy --quiet "$container" "$root" / >/dev/null
  buildah config --env "PATH=/usr/bin:/usr/sbin:/bin" --env MARIADB_DATA=/var/lib/mysql/db \
    --env MYSQL_UNIX_PORT=/tmp/mysqld.sock --env TZ=UTC --env LANG=C \
    --user 999:999 --port 3306 --entrypoint '["/bin/mariadb-start"]' "$container"
  buildah commit --quiet --rm "$container" "$name" >/dev/null
  rm -f "$archive"
  buildah push --quiet "$name" "oci-archive:$archive:$name"
  echo "$want" > "$stamp"
fi
log "$name: $(du -k "$archive" | awk '{printf "%.1f MiB", $1 / 1024}') (archive $archive)"
if [[ "${1:-}" == "--import" ]]; then
  ctr --address "$NODE_RUN/containerd.sock" -n k8s.io images import "$archive" >/dev/null
  log "imported $name into the node's containerd"
fi
echo "$name"
