#!/usr/bin/env bash
# Runs rows of the real tier one at a time, each alone on a control plane of its own
# (`graceful-drain simulate --real --row NAME`), with the EvictionRequest API on and off,
# and prints a table: row, API, outcome, seconds. A row that passes only after other rows
# have run measures the sequence, not itself; this is how to see it. Not part of .ci/run
# (about an hour for every row both ways on the 2-core machine).
#   bash .ci/rows-alone.sh [--api on|off] [ROW...]   (no ROW: every row; no --api: both)
# Extra `simulate` flags (the rows' cluster, traffic) in ROW_FLAGS; default: none, as a
# newcomer runs a row. Each run's log is kept in $ROWS_ALONE_LOGS (default: a temporary
# folder, named at the end).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${GRACEFUL_DRAIN_BIN:-${CARGO_TARGET_DIR:-target}/debug/graceful-drain}"
[ -x "$BIN" ] || cargo build -q --locked --features sim --bin graceful-drain || exit 1
DRAINERS="$(bash .ci/drainers.sh)" || { echo "rows-alone: .ci/drainers.sh failed" >&2; exit 1; }
GRACEFUL_DRAIN_DESCHEDULER="$(sed -n 's/^DESCHEDULER=//p' <<<"$DRAINERS")"
GRACEFUL_DRAIN_KARPENTER="$(sed -n 's/^KARPENTER=//p' <<<"$DRAINERS")"
export GRACEFUL_DRAIN_DESCHEDULER GRACEFUL_DRAIN_KARPENTER

apis=(off on)
if [ "${1:-}" = --api ]; then
  apis=("$2")
  shift 2
fi
rows=("$@")
if [ ${#rows[@]} -eq 0 ]; then
  mapfile -t rows < <("$BIN" simulate --real --list-rows) || exit 1
fi
LOGS="${ROWS_ALONE_LOGS:-$(mktemp -d)}"
mkdir -p "$LOGS"
read -r -a extra <<<"${ROW_FLAGS:-}"

failed=0
printf '%-36s %-4s %-8s %8s\n' row api outcome seconds
for row in "${rows[@]}"; do
  for api in "${apis[@]}"; do
    flags=(--real --row "$row" "${extra[@]}")
    [ "$api" = off ] && flags+=(--no-eviction-request-api)
    log="$LOGS/$row-api-$api"
    started=$SECONDS
    if RUST_LOG=error NO_COLOR=1 "$BIN" simulate "${flags[@]}" >"$log.out" 2>"$log.err"; then
      # A row that does not apply here (e.g. the seed group with the API on) prints no line.
      if grep -q "^$row " "$log.out"; then outcome=pass; else outcome=not-run; fi
    else
      outcome=FAIL
      failed=$((failed + 1))
    fi
    printf '%-36s %-4s %-8s %8d\n' "$row" "$api" "$outcome" $((SECONDS - started))
  done
done
echo "logs: $LOGS"
[ "$failed" -eq 0 ] || { echo "rows-alone: $failed run(s) failed" >&2; exit 1; }
