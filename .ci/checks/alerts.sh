#!/usr/bin/env bash
# The chart's alerts and dashboard: renders the PrometheusRule (metrics.prometheusRule.enabled)
# as release graceful-drain in namespace graceful-drain, then
#   promtool check rules   its spec, and every dashboard query as a recording rule;
#   promtool test rules    charts/graceful-drain/tests/alerts-test.yaml against it.
# That the queries name only exported metrics is checked on live /metrics by
# crates/graceful-drain-e2e/tests/metrics_names.rs.
#
# promtool is built from the Prometheus module served by the Go module proxy into the cache
# outside the clone ($GRACEFUL_DRAIN_CACHE, else $XDG_CACHE_HOME/graceful-drain, else
# ~/.cache/graceful-drain), once: 14.4 minutes cold on the 2-core machine while it also built
# other things (load average 9-11), a no-op after.
#   bash .ci/checks/alerts.sh [--build-only]   (--build-only: build promtool and stop)
set -euo pipefail
cd "$(dirname "$0")/../.."

PROMETHEUS_VERSION="v0.316.0"
CACHE="${GRACEFUL_DRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/graceful-drain}"
PROMTOOL_DIR="$CACHE/tools/promtool-$PROMETHEUS_VERSION"
PROMTOOL="$PROMTOOL_DIR/promtool"
CHART=charts/graceful-drain
TESTS="$CHART/tests/alerts-test.yaml"
DASHBOARD="$CHART/files/grafana-dashboard.json"

die() { printf 'alerts: FAIL %s\n' "$*" >&2; exit 1; }

if [ "${1:-}" != --build-only ]; then
  TOOLS_ENV="$(bash .ci/install-tools.sh --print-env)" || die ".ci/install-tools.sh"
  eval "$TOOLS_ENV"
fi

if [ ! -x "$PROMTOOL" ]; then
  echo "alerts: building promtool $PROMETHEUS_VERSION into $PROMTOOL_DIR"
  # Built into a scratch folder and moved in whole, so an interrupted build leaves nothing
  # that looks finished.
  rm -rf "$PROMTOOL_DIR.tmp"
  mkdir -p "$PROMTOOL_DIR.tmp"
  started=$SECONDS
  GOBIN="$PROMTOOL_DIR.tmp" GOFLAGS=-mod=mod \
    go install "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" \
    || die "go install promtool@$PROMETHEUS_VERSION"
  rm -rf "$PROMTOOL_DIR"
  mv "$PROMTOOL_DIR.tmp" "$PROMTOOL_DIR"
  echo "alerts: promtool built in $((SECONDS - started)) s"
fi
"$PROMTOOL" --version >/dev/null 2>&1 || die "$PROMTOOL does not run"
[ "${1:-}" != --build-only ] || exit 0

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# The rules file promtool reads is the PrometheusRule's spec (the chart renders the rule only
# with the ServiceMonitors that scrape what it reads).
helm template graceful-drain "$CHART" --namespace graceful-drain \
  --set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true \
  --show-only templates/prometheus-rule.yaml \
  >"$WORK/prometheus-rule.yaml" || die "helm template with metrics.prometheusRule.enabled"
python3 - "$WORK/prometheus-rule.yaml" "$WORK/rules.yaml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
assert doc["kind"] == "PrometheusRule", doc["kind"]
with open(sys.argv[2], "w", encoding="utf-8") as out:
    yaml.safe_dump(doc["spec"], out, sort_keys=False)
PY

echo "alerts: promtool check rules"
"$PROMTOOL" check rules "$WORK/rules.yaml" || die "promtool check rules"

# Every dashboard query must parse: each becomes a recording rule, with Grafana's variables
# given values.
python3 - "$DASHBOARD" "$WORK/dashboard-rules.yaml" <<'PY'
import json, sys, yaml
dash = json.load(open(sys.argv[1], encoding="utf-8"))
rules = []
def walk(panels):
    for p in panels:
        walk(p.get("panels", []))
        for t in p.get("targets", []):
            expr = (t["expr"].replace("$__rate_interval", "2m").replace("$namespace", "graceful-drain")
                    .replace("$cluster", ".*"))
            rules.append({"record": f"dashboard:panel{p['id']}:{t['refId']}", "expr": expr})
walk(dash["panels"])
assert rules, "the dashboard has no query"
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
print(f"  {len(rules)} dashboard queries")
PY
"$PROMTOOL" check rules "$WORK/dashboard-rules.yaml" >"$WORK/check.log" 2>&1 \
  || { cat "$WORK/check.log"; die "a dashboard query does not parse"; }

echo "alerts: promtool test rules"
cp "$TESTS" "$WORK/alerts-test.yaml"
"$PROMTOOL" test rules "$WORK/alerts-test.yaml" || die "promtool test rules $TESTS"

# Every alert of the rule file has a test case, firing and not.
python3 - "$WORK/rules.yaml" "$TESTS" <<'PY'
import sys, yaml
rules = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
tests = yaml.safe_load(open(sys.argv[2], encoding="utf-8"))
alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
fires, quiet = set(), set()
for t in tests["tests"]:
    for case in t.get("alert_rule_test", []):
        (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
missing = sorted((alerts - fires) | (alerts - quiet))
if missing:
    sys.exit(f"alerts: FAIL no firing and non-firing test case for {', '.join(missing)}")
print(f"  {len(alerts)} alerts, each tested firing and not")
PY
echo "alerts: ok"
