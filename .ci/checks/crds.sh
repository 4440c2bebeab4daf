#!/usr/bin/env bash
# Fails when the committed lifecycle.graceful-drain.io CRDs differ from what `graceful-drain crds`
# prints. Fix with: cargo run -q -- crds > charts/graceful-drain/files/lifecycle-crds.yaml
set -euo pipefail
cd "$(dirname "$0")/../.."
committed=charts/graceful-drain/files/lifecycle-crds.yaml
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
# The binary `.ci/run` built already (a `cargo run` here would rebuild the crate with
# other dependency features than the all-targets build, for minutes).
BIN="${GRACEFUL_DRAIN_BIN:-${CARGO_TARGET_DIR:-target}/debug/graceful-drain}"
[ -x "$BIN" ] || cargo build -q --locked --bin graceful-drain
"$BIN" crds >"$generated"
if ! diff -u "$committed" "$generated"; then
  echo "error: $committed is stale; regenerate it with:" >&2
  echo "  cargo run -q -- crds > $committed" >&2
  exit 1
fi
echo "lifecycle CRDs up to date"
