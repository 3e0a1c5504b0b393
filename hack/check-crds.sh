#!/usr/bin/env bash
# Fails when deploy/crds/ differs from the CRDs generated from the Rust types, or the Helm
# chart deploy/helm/custody from what hack/gen-chart.sh writes from deploy/.
# Regenerate with: cargo run -p custody-controller -- crds --dir deploy/crds
set -euo pipefail
cd "$(dirname "$0")/.."
generated=$(mktemp -d)
trap 'rm -rf "$generated"' EXIT
cargo run -q -p custody-controller --locked -- crds --dir "$generated"
if ! diff -ru deploy/crds "$generated"; then
  echo "deploy/crds is out of date: cargo run -p custody-controller -- crds --dir deploy/crds" >&2
  exit 1
fi
echo "deploy/crds matches the Rust types"
# The Helm chart is written from deploy/ by hack/gen-chart.sh.
chart="$generated/chart"
hack/gen-chart.sh "$chart" >/dev/null
if ! diff -ru --no-dereference deploy/helm/custody "$chart"; then
  echo "deploy/helm/custody is out of date: hack/gen-chart.sh" >&2
  exit 1
fi
echo "deploy/helm/custody matches deploy/"
