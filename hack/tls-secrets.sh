#!/usr/bin/env bash
# Creates the two TLS Secrets `kubectl apply -k deploy/` expects in custody-system, signed by a
# CA made here (kept with the cluster's files, so a second run reuses it):
#   custody-agent-tls    the agents' gate certificate (name custody-agent)
#   custody-report-tls   the controller's report service (custody-controller.custody-system.svc)
# Each Secret carries tls.crt, tls.key and ca.crt. Existing Secrets are left alone.
#
#   hack/tls-secrets.sh [KUBECTL ARGS...]   # e.g. --kubeconfig=FILE; default: the local cluster
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"

args=("$@")
k() { if ((${#args[@]})); then kubectl "${args[@]}" "$@"; else kubectl_local "$@"; fi; }

dir="$CLUSTER_DIR/custody-tls"
mkdir -p "$dir"
cd "$dir"
if [[ ! -s ca.crt ]]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=custody-ca" \
    -keyout ca.key -out ca.crt 2>/dev/null
fi
issue() { # NAME DNS-NAME
  [[ -s "$1.crt" ]] && return
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
  printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth\n' "$2" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
issue agent custody-agent
issue report custody-controller.custody-system.svc

k create namespace custody-system --dry-run=client -o yaml | k apply -f - >/dev/null
for pair in custody-agent-tls:agent custody-report-tls:report; do
  secret=${pair%%:*} file=${pair##*:}
  if k -n custody-system get secret "$secret" >/dev/null 2>&1; then
    log "Secret custody-system/$secret exists: left alone"
    continue
  fi
  k -n custody-system create secret generic "$secret" --type=kubernetes.io/tls \
    --from-file=tls.crt="$file.crt" --from-file=tls.key="$file.key" --from-file=ca.crt=ca.crt >/dev/null
  log "created Secret custody-system/$secret"
done
