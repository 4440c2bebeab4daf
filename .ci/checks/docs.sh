#!/usr/bin/env bash
# Docs checks:
# 1. docs/cli.md is what `graceful-drain cli-docs` prints (a build with the default features,
#    so `simulate` is documented too). Fix with: cargo run -q -- cli-docs > docs/cli.md
# 2. rustdoc builds without a warning (broken intra-doc links, bad code blocks), for the
#    default build and for the shipped one (--no-default-features).
set -euo pipefail
cd "$(dirname "$0")/../.."
committed=docs/cli.md
generated=$(mktemp)
trap 'rm -f "$generated"' EXIT
cargo run -q --locked -- cli-docs >"$generated"
if ! diff -u "$committed" "$generated"; then
  echo "error: $committed is stale; regenerate it with:" >&2
  echo "  cargo run -q -- cli-docs > $committed" >&2
  exit 1
fi
echo "docs: $committed up to date"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked --no-default-features
echo "docs: rustdoc clean"
