#!/usr/bin/env bash
# Fails when the committed lifecycle.graceful-drain.io CRDs (and their seed-group copies)
# differ from what `graceful-drain crds` (`--seed-group`) prints. Fix with:
#   cargo run -q -- crds > charts/graceful-drain/files/lifecycle-crds.yaml
#   cargo run -q -- crds --seed-group > charts/graceful-drain/files/lifecycle-crds-seed.yaml
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
seed=charts/graceful-drain/files/lifecycle-crds-seed.yaml
"$BIN" crds --seed-group >"$generated"
if ! diff -u "$seed" "$generated"; then
  echo "error: $seed is stale; regenerate it with:" >&2
  echo "  cargo run -q -- crds --seed-group > $seed" >&2
  exit 1
fi
echo "lifecycle CRDs up to date"
