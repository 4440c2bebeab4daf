#!/usr/bin/env bash
# The scenario matrix, our scoreboard: every named scenario of `graceful-drain simulate
# --matrix`, without and with graceful-drain, on the debug build CI already made. It exits
# non-zero when a row differs from what its scenario expects — a protected row with a 5xx
# or a pod deleted unprotected it does not expect, an unprotected row without the 5xx it
# should show, or a run that failed — and then prints the timeline of that row.
#   bash .ci/checks/matrix.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${GRACEFUL_DRAIN_BIN:-${CARGO_TARGET_DIR:-target}/debug/graceful-drain}"
[ -x "$BIN" ] || cargo build -q --locked --bin graceful-drain
# Component logs go to a file; the table and the progress lines stay on the console.
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
if ! RUST_LOG=error "$BIN" simulate --matrix 2> >(tee "$LOG" | grep -a '^\[\|^running' >&2); then
  echo "matrix: FAIL (last log lines follow)" >&2
  tail -n 40 "$LOG" >&2
  exit 1
fi
echo "matrix: ok"
