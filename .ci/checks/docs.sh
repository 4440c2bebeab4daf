#!/usr/bin/env bash
# Docs checks:
# 1. docs/cli.md is what `graceful-drain cli-docs` prints (a build with the `sim` feature,
#    so `simulate` is documented too). Fix with: cargo run -q --features sim -- cli-docs > docs/cli.md
# 2. rustdoc builds without a warning (broken intra-doc links, bad code blocks), for every
#    crate of the workspace and for the shipped binary alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
committed=docs/cli.md
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
# The binary `.ci/run` built already (a `cargo run` here would rebuild the crate with
# other dependency features than the all-targets build, for minutes).
BIN="${GRACEFUL_DRAIN_BIN:-${CARGO_TARGET_DIR:-target}/debug/graceful-drain}"
[ -x "$BIN" ] || cargo build -q --locked --bin graceful-drain
"$BIN" cli-docs >"$generated"
if ! diff -u "$committed" "$generated"; then
  echo "error: $committed is stale; regenerate it with:" >&2
  echo "  cargo run -q --features sim -- cli-docs > $committed" >&2
  exit 1
fi
echo "docs: $committed up to date"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked --workspace --all-features
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked --package graceful-drain
echo "docs: rustdoc clean"
