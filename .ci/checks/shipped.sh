#!/usr/bin/env bash
# Tested versus shipped: every object the suites and the real tier's rows register from the
# chart (webhook configurations, RBAC, admission policies, FlowSchema; the `tested-objects`
# binary prints them as crates/graceful-drain-sim/src/scenario/shipped.rs builds them) must
# equal the chart as Helm renders it, in every field but where the API server calls the
# webhook (a loopback url and the test's CA instead of the Service and cert-manager's
# injection). Checked at the chart's defaults and with a timeoutSeconds a test may set.
set -euo pipefail
cd "$(dirname "$0")/../.."

TOOLS_ENV="$(bash .ci/install-tools.sh --print-env)" || { echo "shipped: FAIL .ci/install-tools.sh" >&2; exit 1; }
eval "$TOOLS_ENV"
PY="$(dirname "$(command -v kubernetes-validate)")/python"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
BASE_URL="https://127.0.0.1:9443"

cargo build --quiet --locked --package graceful-drain-e2e --bin tested-objects
BIN="${CARGO_TARGET_DIR:-target}/debug/tested-objects"

status=0
for timeout in default 3; do
  set_args=()
  tested_args=()
  if [ "$timeout" != default ]; then
    set_args=(--set "webhook.timeoutSeconds=$timeout")
    tested_args=(--timeout-seconds "$timeout")
  fi
  echo "shipped: chart (release graceful-drain, namespace graceful-drain, timeoutSeconds $timeout) against tested-objects"
  helm template graceful-drain charts/graceful-drain --namespace graceful-drain \
    --kube-version 1.33.0 "${set_args[@]}" >"$WORK/rendered.yaml"
  "$BIN" "${tested_args[@]}" >"$WORK/tested.json"
  "$PY" .ci/checks/shipped.py "$WORK/rendered.yaml" "$WORK/tested.json" "$BASE_URL" || status=1
done
if [ "$status" -ne 0 ]; then
  echo "shipped: FAIL the tests register objects that differ from the chart's (above)" >&2
  exit 1
fi
echo "shipped: ok"
