#!/usr/bin/env bash
# Fails when the committed lifecycle.k8s.io CRDs differ from what `graceful-drain crds`
# prints. Fix with: cargo run -q -- crds > charts/graceful-drain/files/lifecycle-crds.yaml
set -euo pipefail
cd "$(dirname "$0")/../.."
committed=charts/graceful-drain/files/lifecycle-crds.yaml
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
cargo run -q --locked -- crds >"$generated"
if ! diff -u "$committed" "$generated"; then
  echo "error: $committed is stale; regenerate it with:" >&2
  echo "  cargo run -q -- crds > $committed" >&2
  exit 1
fi
echo "lifecycle CRDs up to date"
