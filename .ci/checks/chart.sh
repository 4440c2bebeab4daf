#!/usr/bin/env bash
# Chart checks: helm lint --strict, helm template in each certificate mode, offline schema
# validation (Kubernetes 1.33..1.37 and cert-manager), semantic assertions, values-schema
# negative cases, freshness of the rendered deploy/ manifests and, when the binary has a
# simulated cluster, `kubectl apply` of the rendered manifests to it.
#   bash .ci/checks/chart.sh            check
#   bash .ci/checks/chart.sh --update   rewrite deploy/graceful-drain.yaml and deploy/seed-group.yaml
set -euo pipefail
cd "$(dirname "$0")/../.."

# A failed install must stop here, not later as "helm: command not found".
TOOLS_ENV="$(bash .ci/install-tools.sh --print-env)" || { echo "chart: FAIL .ci/install-tools.sh" >&2; exit 1; }
eval "$TOOLS_ENV"
CHART=charts/graceful-drain
NS=graceful-drain
KUBE_VERSIONS="1.33.0 1.34.0 1.35.0 1.36.0 1.37.0"
WORK="$(mktemp -d)"
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
PY="$(dirname "$(command -v kubernetes-validate)")/python"
CHECKS=.ci/checks/chart

say() { printf '  %s\n' "$*"; }
die() { printf 'chart: FAIL %s\n' "$*" >&2; exit 1; }
# Locally a check that needs the built binary may be skipped; in CI (which builds it
# first) a skip is a failure.
skip() { [ -z "${CI:-}" ] || die "$* (CI must run this check)"; say "skipped: $*"; }
# One assert.py check: its output, and its failure stops the script (a `say "$(...)"`
# would print the FAIL lines and go on).
assert_py() {
  local out
  out="$($PY "$CHECKS/assert.py" "$@")" || { printf '%s\n' "$out" >&2; die "assert.py $1"; }
  say "$out"
}

# A CA bundle for the user-provided-Secret mode (any PEM will do for rendering).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "/CN=test CA" \
  -keyout "$WORK/ca.key" -out "$WORK/ca.crt" 2>/dev/null
CA_BUNDLE="$(base64 -w0 <"$WORK/ca.crt")"

mode_args() {
  case "$1" in
    cert-manager) echo "--set certificates.mode=cert-manager" ;;
    self-signed) echo "--set certificates.mode=self-signed" ;;
    secret) echo "--set certificates.mode=secret --set certificates.secret.name=my-tls --set certificates.secret.caBundle=$CA_BUNDLE" ;;
  esac
}

# The raw manifests for users without Helm: cert-manager mode, fixed release name,
# namespace and Kubernetes version, with the Namespace (and its Pod Security labels) in
# front (namespace.create; helm template sorts Namespaces first).
render_deploy() {
  cat <<HEADER
# graceful-drain: raw manifests for clusters without Helm (cert-manager must be installed).
# Generated from charts/graceful-drain by .ci/checks/chart.sh --update; do not edit by hand.
# kubectl apply --server-side -f deploy/graceful-drain.yaml
HEADER
  helm template graceful-drain "$CHART" --namespace "$NS" --kube-version 1.33.0 \
    --set certificates.mode=cert-manager --set namespace.create=true
}

# charts/graceful-drain/README.md carries docs/install.md's values table between two
# markers, its links rewritten for the chart's folder: one table to maintain.
render_readme() {
  $PY "$CHECKS/assert.py" readme docs/install.md "$CHART/README.md"
}

# What lifecycleCrds.seedGroup adds, for clusters without Helm (applied over
# deploy/graceful-drain.yaml) and for the real tier's seed-group row.
render_seed_group() {
  echo "# The lifecycle.k8s.io seed group (chart value lifecycleCrds.seedGroup=true), applied over"
  echo "# graceful-drain.yaml where Kubernetes does not serve that group (docs/lifecycle.md)."
  helm template graceful-drain "$CHART" --namespace "$NS" --kube-version 1.33.0 \
    --set certificates.mode=cert-manager --set lifecycleCrds.seedGroup=true \
    --show-only templates/lifecycle-crds.yaml --show-only templates/agent-rbac.yaml
}

if [ "${1:-}" = "--update" ]; then
  render_deploy >deploy/graceful-drain.yaml
  render_seed_group >deploy/seed-group.yaml
  render_readme >"$WORK/README.md" && cp "$WORK/README.md" "$CHART/README.md"
  echo "chart: wrote deploy/graceful-drain.yaml, deploy/seed-group.yaml and $CHART/README.md's values table"
  exit 0
fi

echo "chart: helm lint --strict"
for mode in cert-manager self-signed secret; do
  # shellcheck disable=SC2046
  helm lint --strict --quiet "$CHART" --namespace "$NS" $(mode_args "$mode") >"$WORK/lint.log" 2>&1 \
    || { cat "$WORK/lint.log"; die "helm lint --strict in mode $mode"; }
  say "lint $mode: ok"
done

echo "chart: helm template and validation"
render() { # name, mode, extra helm args...
  local name="$1" mode="$2"
  shift 2
  # shellcheck disable=SC2046
  helm template graceful-drain "$CHART" --namespace "$NS" $(mode_args "$mode") "$@" >"$WORK/$name.yaml" \
    || die "helm template $name"
  mkdir -p "$WORK/$name"
  say "$name: $($PY "$CHECKS/assert.py" split "$WORK/$name.yaml" "$WORK/$name")"
}
render cert-manager cert-manager
render self-signed self-signed
render secret secret
render everything cert-manager --set metrics.serviceMonitor.enabled=true \
  --set metrics.prometheusRule.enabled=true --set metrics.prometheusRule.labels.release=prometheus \
  --set metrics.dashboard.enabled=true --set metrics.dashboard.namespace=monitoring \
  --set networkPolicy.enabled=true --set 'networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring' \
  --set webhook.podAntiAffinity=hard --set certificates.certManager.issuerRef.name=corp-ca \
  --set certificates.certManager.issuerRef.kind=ClusterIssuer --set webhook.failurePolicy=Fail \
  --set agent.drain.force=true --set agent.drain.gracePeriodSeconds=30 --set agent.drain.timeout=10m \
  --set agent.drain.ignoreDaemonsets=false --set webhook.deregistrationDelay=45s \
  --set namespace.create=true --set logLevel=debug \
  --set-json 'webhook.namespaceSelector={"matchLabels":{"team":"payments"},"matchExpressions":[{"key":"env","operator":"In","values":["prod"]}]}' \
  --set-json 'webhook.securityContext={"allowPrivilegeEscalation":false,"readOnlyRootFilesystem":true,"capabilities":{"drop":["ALL"]},"seccompProfile":{"type":"RuntimeDefault"},"runAsUser":1000}' \
  --set agent.podSecurityContext.seccompProfile.type=Unconfined \
  --set-json 'agent.drain.tiers=[{"name":"databases","match":[{"namespaces":["db"]},{"priorityClassNames":["critical-db"]}]}]' \
  --set-json "agent.hooks=[{\"name\":\"evacuate-vms\",\"at\":\"before-eviction\",\"timeout\":\"30m\",\"https\":{\"url\":\"https://vm-evacuator.ops.svc/evacuate\",\"caBundle\":\"$CA_BUNDLE\"}},{\"name\":\"report\",\"at\":\"after-last-pod\",\"optional\":true,\"job\":{\"namespace\":\"ops\",\"template\":{\"spec\":{\"template\":{\"spec\":{\"containers\":[{\"name\":\"report\",\"image\":\"busybox\"}]}}}}}}]"
render minimal self-signed --set agent.enabled=false --set lifecycleCrds.install=false \
  --set metrics.prometheusRule.enabled=true --set metrics.prometheusRule.scrapedElsewhere=true
render hostnet self-signed --set webhook.hostNetwork=true --set webhook.port=10443 \
  --set webhook.adminPort=10490 --set webhook.replicas=1 --set webhook.zoneSpread=hard \
  --set priorityClassQuota.enabled=true --set agent.drain.deleteEmptydirData=true
grep -q 'alert: GracefulDrainWebhookDown' "$WORK/everything.yaml" || die "everything: no PrometheusRule"
grep -q 'alert: GracefulDrainDrainStuck' "$WORK/everything.yaml" || die "everything: no agent alerts"
grep -q 'grafana_dashboard: "1"' "$WORK/everything.yaml" || die "everything: no dashboard ConfigMap"
if grep -q 'alert: GracefulDrainDrainStuck' "$WORK/minimal.yaml"; then
  die "minimal: agent alerts rendered without an agent"
fi
for plain in cert-manager self-signed secret; do
  if grep -qE 'kind: PrometheusRule|grafana_dashboard' "$WORK/$plain.yaml"; then
    die "$plain: alerts or dashboard rendered while off by default"
  fi
done
say "alerts and dashboard: rendered when on, agent alerts only with the agent, off by default"
# A PrometheusRule whose metrics nothing scrapes is refused, saying why and how to go on.
if helm template graceful-drain "$CHART" --namespace "$NS" --set metrics.prometheusRule.enabled=true \
  >/dev/null 2>"$WORK/rule-refused.log"; then
  die "metrics.prometheusRule.enabled rendered without metrics.serviceMonitor.enabled"
fi
for hint in "nothing scrapes" "metrics.serviceMonitor.enabled=true" "metrics.prometheusRule.scrapedElsewhere=true"; do
  grep -qF "$hint" "$WORK/rule-refused.log" || die "PrometheusRule refusal lacks '$hint': $(cat "$WORK/rule-refused.log")"
done
say "PrometheusRule without ServiceMonitor: refused, naming serviceMonitor.enabled and scrapedElsewhere"
assert_py users "$WORK/everything.yaml" "$NS"
assert_py monitoring "$WORK/everything.yaml" docs/troubleshooting.md
assert_py variants "$WORK/hostnet.yaml"
if grep -q '^kind: ResourceQuota' "$WORK/cert-manager.yaml"; then
  die "cert-manager: a ResourceQuota rendered by default (priorityClassQuota.enabled is off)"
fi
if grep -q '^kind: Namespace' "$WORK/cert-manager.yaml"; then
  die "cert-manager: a Namespace rendered by default (it conflicts with helm --create-namespace)"
fi
# A level the node agent cannot run under is refused when the chart renders the namespace.
if helm template graceful-drain "$CHART" --namespace "$NS" --set namespace.create=true \
  --set namespace.podSecurity=baseline >/dev/null 2>"$WORK/psa-refused.log"; then
  die "namespace.podSecurity=baseline rendered with the node agent"
fi
grep -q "refuse the node agent" "$WORK/psa-refused.log" || die "baseline refusal does not say why: $(cat "$WORK/psa-refused.log")"
helm template graceful-drain "$CHART" --namespace "$NS" --set namespace.create=true \
  --set namespace.podSecurity=restricted --set agent.enabled=false | grep -q 'pod-security.kubernetes.io/enforce: restricted' \
  || die "namespace.podSecurity=restricted without the agent"
if helm template graceful-drain "$CHART" --namespace "$NS" --set namespace.create=true \
  --set namespace.podSecurity=restricted --set agent.enabled=false --set webhook.hostNetwork=true \
  >/dev/null 2>"$WORK/psa-hostnet.log"; then
  die "namespace.podSecurity=restricted rendered with webhook.hostNetwork"
fi
grep -q "host network" "$WORK/psa-hostnet.log" || die "hostNetwork refusal does not say why: $(cat "$WORK/psa-hostnet.log")"
say "namespace: off by default, baseline refused with the agent, restricted for the webhook alone (not on the host network)"
render seed self-signed --set lifecycleCrds.seedGroup=true
grep -q 'name: lifecycleevents.lifecycle.k8s.io' "$WORK/seed.yaml" || die "seedGroup: no seed-group LifecycleEvent CRD"
# Where Kubernetes serves lifecycle.k8s.io itself, seed-group CRDs would never be served.
if helm template graceful-drain "$CHART" --namespace "$NS" $(mode_args self-signed) \
  --set lifecycleCrds.seedGroup=true --api-versions lifecycle.k8s.io/v1alpha1/EvictionRequest \
  >/dev/null 2>"$WORK/seed-refused.log"; then
  die "seedGroup rendered on a cluster serving the EvictionRequest API"
fi
grep -q "never served" "$WORK/seed-refused.log" || die "seedGroup refusal does not say why: $(cat "$WORK/seed-refused.log")"
say "seed: refused where Kubernetes serves lifecycle.k8s.io"

for name in cert-manager self-signed secret everything minimal hostnet seed; do
  for v in $KUBE_VERSIONS; do
    kubernetes-validate --strict --quiet --no-warn -k "$v" "$WORK/$name/core.yaml" >"$WORK/kv.log" 2>&1 \
      || { cat "$WORK/kv.log"; die "kubernetes-validate $name against $v"; }
  done
  node "$CHECKS/cert-manager.mjs" "$GRACEFUL_DRAIN_NODE_MODULES" "$WORK/$name/cert-manager.json" >/dev/null \
    || die "cert-manager models reject $name"
done
say "kubernetes-validate --strict $KUBE_VERSIONS and cert-manager models: ok"

# The oldest Kubernetes the chart claims (Chart.yaml kubeVersion: matchConditions and CRD
# selectableFields are GA there) accepts every field; an older one is refused by helm.
helm template graceful-drain "$CHART" --namespace "$NS" --kube-version 1.32.0 >"$WORK/k132.yaml"
mkdir -p "$WORK/k132" && $PY "$CHECKS/assert.py" split "$WORK/k132.yaml" "$WORK/k132" >/dev/null
kubernetes-validate --strict --quiet --no-warn -k 1.32.0 "$WORK/k132/core.yaml" >"$WORK/kv.log" 2>&1 \
  || { cat "$WORK/kv.log"; die "kubernetes-validate against 1.32"; }
if helm template graceful-drain "$CHART" --kube-version 1.31.0 >/dev/null 2>&1; then
  die "helm template accepted Kubernetes 1.31, below Chart.yaml kubeVersion"
fi
say "Kubernetes 1.32 (oldest supported) valid, 1.31 refused: ok"

# The validators themselves must catch a broken object.
sed 's/revisionHistoryLimit: 5/revisionHistoryLimitt: 5/' "$WORK/cert-manager/core.yaml" >"$WORK/broken.yaml"
if kubernetes-validate --strict --quiet --no-warn -k 1.37.0 "$WORK/broken.yaml" >/dev/null 2>&1; then
  die "kubernetes-validate accepted an unknown field"
fi
sed 's/"secretName"/"secretNam"/' "$WORK/cert-manager/cert-manager.json" >"$WORK/broken.json"
if node "$CHECKS/cert-manager.mjs" "$GRACEFUL_DRAIN_NODE_MODULES" "$WORK/broken.json" >/dev/null 2>&1; then
  die "cert-manager validation accepted an unknown field"
fi
say "validators reject unknown fields: ok"

echo "chart: semantic assertions"
$PY "$CHECKS/assert.py" check cert-manager "$WORK/cert-manager.yaml"
$PY "$CHECKS/assert.py" check self-signed "$WORK/self-signed.yaml"
$PY "$CHECKS/assert.py" check secret "$WORK/secret.yaml" "$CA_BUNDLE"
say "webhook, agent, RBAC and certificates in each mode: ok"

echo "chart: values schema rejects bad values"
bad_values=(
  "webhook.replicas=0"                      # below the minimum (1, with a warning)
  "webhook.replicas=two"                    # wrong type
  "webhook.timeoutSeconds=31"               # above the API server's maximum
  "webhook.failurePolicy=Maybe"             # bad enum
  "certificates.mode=vault"                 # bad enum
  "agent.lifecycleReconciler=sometimes"     # bad enum
  "webhook.exposure=everything"             # bad enum
  "agent.sla=soon"                          # not a duration
  "webhook.bogus=1"                         # unknown key
  "unknownTopLevel=1"                       # unknown key
  "agent.drain.forse=true"                  # unknown (misspelt) key
  "agent.hooks[0].name=x"                   # a hook without at, https or job
  "certificates.mode=secret"                # secret mode without name/caBundle
  "metrics.prometheusRule.bogus=1"          # unknown key
  "metrics.dashboard.enabled=yes"           # wrong type
  "logLevel=loud"                           # neither a level nor a filter
  "namespace.podSecurity=open"              # bad enum
  "namespace.bogus=1"                       # unknown key
  "webhook.securityContext.privilegd=true"  # unknown (misspelt) field
  "agent.podSecurityContext.runAsUser=-1"   # below the minimum
  "webhook.namespaceSelector.matchExpressions[0].key=env" # no operator
  "webhook.namespaceSelector.matchLabel.a=b" # unknown (misspelt) key
  "webhook.zoneSpread=everywhere"           # bad enum
  "webhook.hostNetwork=yes"                 # wrong type
  "priorityClassQuota.bogus=1"              # unknown key
  "priorityClassQuota.pods=lots"            # not a quantity
  "metrics.prometheusRule.runbookBaseUrl=https://x/t.md#a" # an anchor of its own
  "networkPolicy.serviceMonitorFrom=all"    # wrong type
)
for bad in "${bad_values[@]}"; do
  if helm template graceful-drain "$CHART" --set "$bad" >/dev/null 2>"$WORK/err.log"; then
    die "helm template accepted --set $bad"
  fi
  grep -q "schema" "$WORK/err.log" || { cat "$WORK/err.log"; die "--set $bad failed, but not on the schema"; }
  if helm lint --strict --quiet "$CHART" --set "$bad" >/dev/null 2>&1; then
    die "helm lint accepted --set $bad"
  fi
done
say "${#bad_values[@]} bad values rejected by template and lint: ok"

echo "chart: the binary accepts the rendered command lines"
# The binary `cargo build` wrote, wherever CARGO_TARGET_DIR puts it.
BIN="${GRACEFUL_DRAIN_BIN:-${CARGO_TARGET_DIR:-target}/debug/graceful-drain}"
# A subcommand still stubbed on this branch has only the shared flags (--kubeconfig,
# --context, --log-format, --help, --version); its check waits for the real one.
implemented() { [ "$("$BIN" "$1" --help 2>/dev/null | grep -cE '^ *(-[a-zA-Z], )?--[a-z]')" -gt 5 ]; }
if [ ! -x "$BIN" ]; then
  skip "no $BIN (cargo build first)"
elif implemented webhook && implemented node-agent; then
  $PY "$CHECKS/assert.py" cli "$BIN" "$WORK/everything.yaml" | sed 's/^/  /'
  $PY "$CHECKS/assert.py" cli "$BIN" deploy/graceful-drain.yaml | sed 's/^/  /'
else
  skip "webhook or node-agent not implemented in $BIN"
fi

echo "chart: kubectl apply to the simulated cluster"
# Applies the rendered core manifests with the real kubectl to `graceful-drain simulate
# --serve`, checks the webhook configurations come back as rendered, then asks helm to
# render self-signed mode again against that cluster: `lookup` must find the Secret and
# reuse its certificate (what keeps caBundle stable across `helm upgrade`).
sim_apply() {
  local kc="$WORK/sim.kubeconfig" log="$WORK/sim.log" pid
  "$BIN" simulate --serve --nodes 1 --kubeconfig-out "$kc" >"$log" 2>&1 &
  pid=$!
  # shellcheck disable=SC2064
  trap "kill $pid 2>/dev/null || true; [ -n \"${KEEP_WORK:-}\" ] || rm -rf '$WORK'" EXIT
  for _ in $(seq 1 150); do # up to 30 s
    [ -s "$kc" ] && kubectl --kubeconfig "$kc" get --raw /version >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { cat "$log"; die "simulate --serve exited"; }
    sleep 0.2
  done
  [ -s "$kc" ] || { cat "$log"; die "simulate --serve wrote no kubeconfig in 30 s"; }
  local k=(kubectl --kubeconfig "$kc")
  "${k[@]}" api-resources --no-headers >"$WORK/api-resources.txt"
  # The raw manifests (deploy/, cert-manager mode), as a user without Helm applies them.
  say "deploy/: $($PY "$CHECKS/assert.py" served deploy/graceful-drain.yaml "$WORK/api-resources.txt" "$WORK/deploy.served.yaml")"
  "${k[@]}" apply -f "$WORK/deploy.served.yaml" >"$WORK/apply.log" 2>&1 \
    || { cat "$WORK/apply.log"; die "kubectl apply of deploy/graceful-drain.yaml"; }
  "${k[@]}" get mutatingwebhookconfigurations,validatingwebhookconfigurations -o json >"$WORK/got.json"
  $PY "$CHECKS/assert.py" applied cert-manager deploy/graceful-drain.yaml "$WORK/got.json"
  say "deploy/: kubectl apply; webhook configurations served back with their inject-ca-from"
  # Self-signed mode as release gd in gd-system, applied as Helm would have installed it
  # (.ci/checks/helm.sh runs helm install/upgrade/uninstall itself). A second render against the cluster, as `helm upgrade` does, must find the
  # Secret with `lookup` and keep the certificate, so the caBundle does not change.
  # (The simulated cluster serves no ValidatingAdmissionPolicy and no FlowSchema:
  # policies-real.sh applies both to a real kube-apiserver and checks what they do.)
  local gd=(gd "$CHART" --namespace gd-system --set certificates.mode=self-signed
    --set lifecycleCrds.install=false --set admissionPolicies.enabled=false
    --set flowControl.enabled=false)
  helm template "${gd[@]}" >"$WORK/gd.yaml"
  $PY "$CHECKS/assert.py" helm-owned "$WORK/gd.yaml" gd gd-system "$WORK/gd.owned.yaml"
  "${k[@]}" apply -f "$WORK/gd.owned.yaml" >"$WORK/apply.log" 2>&1 \
    || { cat "$WORK/apply.log"; die "kubectl apply of the self-signed manifests"; }
  "${k[@]}" get mutatingwebhookconfigurations,validatingwebhookconfigurations -o json >"$WORK/got.json"
  $PY "$CHECKS/assert.py" applied self-signed "$WORK/gd.yaml" "$WORK/got.json"
  say "self-signed: kubectl apply; webhook configurations served back with their caBundle"
  helm template "${gd[@]}" >"$WORK/gd.offline.yaml"
  if $PY "$CHECKS/assert.py" same-ca "$WORK/gd.yaml" "$WORK/gd.offline.yaml" >/dev/null; then
    die "self-signed: two renders without a cluster made the same CA (the next check proves nothing)"
  fi
  helm template "${gd[@]}" --kubeconfig "$kc" --dry-run=server --disable-openapi-validation \
    --set webhook.timeoutSeconds=12 >"$WORK/gd.upgrade.yaml" || die "helm template --dry-run=server"
  $PY "$CHECKS/assert.py" same-ca "$WORK/gd.yaml" "$WORK/gd.upgrade.yaml" >/dev/null \
    || die "self-signed: re-render against the cluster made a new certificate (lookup did not reuse the Secret)"
  grep -q 'timeoutSeconds: 12' "$WORK/gd.upgrade.yaml" || die "upgrade render lost --set webhook.timeoutSeconds=12"
  say "self-signed: upgrade render against the cluster reuses the installed certificate"
  # The simulated cluster serves no cert-manager.io: the default mode must say so, and how
  # to go on, instead of Helm's bare "no matches for kind Certificate".
  if helm template gd "$CHART" --namespace gd-system --kubeconfig "$kc" --dry-run=server \
    --disable-openapi-validation >/dev/null 2>"$WORK/no-cert-manager.log"; then
    die "cert-manager mode rendered against a cluster without cert-manager"
  fi
  for hint in "cert-manager is not installed" "certificates.mode=self-signed" "certificates.mode=secret"; do
    grep -qF "$hint" "$WORK/no-cert-manager.log" || die "cert-manager refusal lacks '$hint': $(cat "$WORK/no-cert-manager.log")"
  done
  say "cert-manager mode without cert-manager: refused, naming self-signed and secret modes"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null || true
}
if [ -x "$BIN" ] && "$BIN" simulate --help 2>/dev/null | grep -q -- '--kubeconfig-out'; then
  sim_apply
else
  skip "$BIN has no simulate --serve"
fi

echo "chart: docs/install.md and the chart's README document every value"
assert_py docs "$CHART/values.yaml" docs/install.md
assert_py docs "$CHART/values.yaml" "$CHART/README.md"
render_readme >"$WORK/README.md"
diff -u "$CHART/README.md" "$WORK/README.md" >"$WORK/readme.diff" \
  || { head -40 "$WORK/readme.diff"; die "$CHART/README.md's values table is stale: run bash .ci/checks/chart.sh --update"; }
say "$CHART/README.md: values table up to date"

echo "chart: Dockerfile"
hadolint Dockerfile || die "hadolint Dockerfile"
grep -q '^ENTRYPOINT \["/usr/local/bin/graceful-drain"\]' Dockerfile || die "Dockerfile ENTRYPOINT"
say "hadolint: ok"
assert_py docker-context

echo "chart: deploy/ is up to date"
render_deploy >"$WORK/deploy.yaml"
diff -u deploy/graceful-drain.yaml "$WORK/deploy.yaml" >"$WORK/deploy.diff" \
  || { head -40 "$WORK/deploy.diff"; die "deploy/graceful-drain.yaml is stale: run bash .ci/checks/chart.sh --update"; }
say "deploy/graceful-drain.yaml: ok"
render_seed_group >"$WORK/seed-group.yaml"
diff -u deploy/seed-group.yaml "$WORK/seed-group.yaml" >"$WORK/seed.diff" \
  || { head -40 "$WORK/seed.diff"; die "deploy/seed-group.yaml is stale: run bash .ci/checks/chart.sh --update"; }
say "deploy/seed-group.yaml: ok"

echo "chart: ok"
