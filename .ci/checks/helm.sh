#!/usr/bin/env bash
# Helm 4 against the simulated cluster: `helm install`, `helm upgrade` and `helm uninstall`
# of charts/graceful-drain with the real helm (server-side apply, release Secrets sent as
# protobuf, kstatus watches for --wait) against `graceful-drain simulate --serve`.
#
# Certificates use the chart's self-signed mode (no cert-manager in the simulated cluster);
# the lifecycle CRDs are not installed by the chart because the simulated cluster already
# serves them; the first install leaves the node agent out and the upgrade adds it (its
# pods come from the simulated DaemonSet controller, and the uninstall check sees the
# garbage collector remove them). Before that, an install in the default cert-manager mode
# must be refused with the ways on (the simulated cluster serves no cert-manager.io); the
# upgrade also takes over the namespace to label it for Pod Security (namespace.create).
#   bash .ci/checks/helm.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

TOOLS_ENV="$(bash .ci/install-tools.sh --print-env)" || { echo "helm: FAIL .ci/install-tools.sh" >&2; exit 1; }
eval "$TOOLS_ENV"
CHART=charts/graceful-drain
NS=gd-system
REL=gd
BIN="${GRACEFUL_DRAIN_BIN:-${CARGO_TARGET_DIR:-target}/debug/graceful-drain}"
WORK="$(mktemp -d)"
PID=""
cleanup() {
  [ -z "$PID" ] || kill "$PID" 2>/dev/null || true
  [ -z "$PID" ] || wait "$PID" 2>/dev/null || true
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

say() { printf '  %s\n' "$*"; }
die() { printf 'helm: FAIL %s\n' "$*" >&2; [ ! -s "$WORK/helm.log" ] || tail -40 "$WORK/helm.log" >&2; exit 1; }

if [ ! -x "$BIN" ] || ! "$BIN" simulate --help 2>/dev/null | grep -q -- '--kubeconfig-out'; then
  [ -z "${CI:-}" ] || die "no $BIN with simulate --serve (CI must run this check)"
  say "skipped: no $BIN with simulate --serve (cargo build first)"
  exit 0
fi

echo "helm: start the simulated cluster"
KC="$WORK/kubeconfig"
"$BIN" simulate --serve --nodes 1 --replicas 1 --kubeconfig-out "$KC" >"$WORK/sim.log" 2>&1 &
PID=$!
for _ in $(seq 1 150); do # up to 30 s
  [ -s "$KC" ] && kubectl --kubeconfig "$KC" get --raw /version >/dev/null 2>&1 && break
  kill -0 "$PID" 2>/dev/null || { cat "$WORK/sim.log"; die "simulate --serve exited"; }
  sleep 0.2
done
[ -s "$KC" ] || { cat "$WORK/sim.log"; die "simulate --serve wrote no kubeconfig in 30 s"; }
export KUBECONFIG="$KC"
k() { kubectl "$@"; }
h() { helm "$@" --namespace "$NS" >"$WORK/helm.log" 2>&1; }
# The simulated cluster serves no ValidatingAdmissionPolicy and no FlowSchema
# (policies-real.sh checks both on a real kube-apiserver).
VALUES=(--set certificates.mode=self-signed --set lifecycleCrds.install=false --set admissionPolicies.enabled=false --set flowControl.enabled=false)

# The webhook configurations' caBundle (the same in both) and timeoutSeconds.
ca_bundle() { k get validatingwebhookconfigurations -l "app.kubernetes.io/instance=$REL" -o jsonpath='{.items[0].webhooks[0].clientConfig.caBundle}'; }
timeout_seconds() { k get validatingwebhookconfigurations -l "app.kubernetes.io/instance=$REL" -o jsonpath='{.items[0].webhooks[0].timeoutSeconds}'; }

echo "helm: install in cert-manager mode, on a cluster without cert-manager"
# The default mode needs cert-manager's CRDs; the chart must say so, and name the other
# modes, before anything is created.
if helm install "$REL" "$CHART" --namespace "$NS" --create-namespace "${VALUES[@]:2}" >"$WORK/no-cm.log" 2>&1; then
  die "helm install in cert-manager mode succeeded without cert-manager"
fi
for hint in "cert-manager is not installed" "certificates.mode=self-signed" "certificates.mode=secret"; do
  grep -qF "$hint" "$WORK/no-cm.log" || die "the refusal lacks '$hint': $(cat "$WORK/no-cm.log")"
done
# (helm 4 lists releases in every status by default.)
helm list --namespace "$NS" -q >"$WORK/list.txt" || die "helm list"
if grep -qx "$REL" "$WORK/list.txt"; then die "the refused install left a release"; fi
say "refused with the ways on (self-signed, secret), no release left"

echo "helm: install"
h install "$REL" "$CHART" --create-namespace "${VALUES[@]}" --set agent.enabled=false --wait --timeout 60s \
  || die "helm install --wait"
k -n "$NS" get deployment "$REL-graceful-drain-webhook" >/dev/null || die "no webhook Deployment after install"
k -n "$NS" get secret "$REL-graceful-drain-webhook-tls" >/dev/null || die "no webhook TLS Secret after install"
k -n "$NS" get secret "sh.helm.release.v1.$REL.v1" >/dev/null || die "no release Secret v1"
managers="$(k -n "$NS" get deployment "$REL-graceful-drain-webhook" -o jsonpath='{.metadata.managedFields[*].manager}/{.metadata.managedFields[*].operation}')"
case "$managers" in
  helm*/Apply*) ;;
  *) die "the webhook Deployment was not server-side applied by helm (managedFields: $managers)" ;;
esac
CA="$(ca_bundle)"
[ -n "$CA" ] || die "webhook configurations have no caBundle"
say "release $REL in $NS: webhook Deployment ready (--wait), applied server-side by helm"

echo "helm: upgrade"
# The chart takes over the namespace --create-namespace made, to label it for Pod Security.
h upgrade "$REL" "$CHART" "${VALUES[@]}" --set webhook.timeoutSeconds=12 \
  --set namespace.create=true --take-ownership || die "helm upgrade"
[ "$(k get namespace "$NS" -o jsonpath='{.metadata.labels.pod-security\.kubernetes\.io/enforce}')" = privileged ] \
  || die "upgrade with namespace.create did not label $NS pod-security.kubernetes.io/enforce=privileged"
[ "$(timeout_seconds)" = 12 ] || die "upgrade did not set timeoutSeconds=12 (got $(timeout_seconds))"
[ "$(ca_bundle)" = "$CA" ] || die "upgrade changed the caBundle (lookup did not find the Secret)"
k -n "$NS" get daemonset "$REL-graceful-drain-agent" >/dev/null || die "upgrade did not add the agent DaemonSet"
helm history "$REL" --namespace "$NS" -o json >"$WORK/history.json" || die "helm history"
grep -q '"revision":2' "$WORK/history.json" || die "no revision 2 in helm history"
helm status "$REL" --namespace "$NS" >"$WORK/status.txt" || die "helm status"
grep -q 'STATUS: deployed' "$WORK/status.txt" || die "release not deployed after upgrade"
say "revision 2 deployed: timeoutSeconds=12, same caBundle, agent DaemonSet added, namespace labelled"

echo "helm: uninstall"
# The webhook keeps its rights until it has dealt with the pods it isolated: its
# ClusterRoleBinding and ServiceAccount carry the finalizer graceful-drain.io/uninstall,
# and Helm keeps its ClusterRole, Role and RoleBinding (helm.sh/resource-policy: keep),
# which a running webhook makes dependents of those two. The real tier runs that webhook
# (row uninstall-mid-drain); none runs here, so this script releases the finalizers and
# removes the kept objects as the webhook and the garbage collector would.
helm uninstall "$REL" --namespace "$NS" --timeout 60s >"$WORK/uninstall.txt" 2>&1 || { cat "$WORK/uninstall.txt"; die "helm uninstall"; }
WH="$REL-graceful-drain-webhook"
held() {
  k get clusterrolebinding "$WH" -o jsonpath='{.metadata.finalizers}' 2>/dev/null
  k -n "$NS" get serviceaccount "$WH" -o jsonpath='{.metadata.finalizers}' 2>/dev/null
}
[ "$(held)" = '["graceful-drain.io/uninstall"]["graceful-drain.io/uninstall"]' ] \
  || die "the webhook's binding and ServiceAccount are not held for its uninstall work: $(held)"
grep -qF "[Namespace] $NS" "$WORK/uninstall.txt" || die "helm uninstall did not keep the namespace: $(cat "$WORK/uninstall.txt")"
for kept in "[ClusterRole] $WH" "[Role] $WH-leader-election" "[RoleBinding] $WH-leader-election"; do
  grep -qF "$kept" "$WORK/uninstall.txt" || die "helm uninstall did not keep $kept: $(cat "$WORK/uninstall.txt")"
done
k patch clusterrolebinding "$WH" --type=json -p '[{"op":"remove","path":"/metadata/finalizers"}]' >/dev/null
k -n "$NS" patch serviceaccount "$WH" --type=json -p '[{"op":"remove","path":"/metadata/finalizers"}]' >/dev/null
k delete clusterrole "$WH" >/dev/null
k -n "$NS" delete role,rolebinding "$WH-leader-election" >/dev/null
say "the webhook's rights were kept for its uninstall work (finalizers, resource-policy keep)"
# What the release owned, directly or through the garbage collector (ReplicaSets), must
# go; pods may still be terminating gracefully but none may be running.
leftovers() {
  k -n "$NS" get deployments,replicasets,daemonsets,services,secrets,configmaps,serviceaccounts,roles,rolebindings,poddisruptionbudgets \
    -l "app.kubernetes.io/instance=$REL" -o name
  k get clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations \
    -l "app.kubernetes.io/instance=$REL" -o name
  k -n "$NS" get secrets -l owner=helm -o name
  k -n "$NS" get pods -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}' \
    | awk 'NF == 1 { print "pod/" $1 " (running)" }'
}
for _ in $(seq 1 150); do # up to 30 s for the garbage collector
  [ -z "$(leftovers)" ] && break
  sleep 0.2
done
left="$(leftovers)"
[ -z "$left" ] || die "uninstall left: $left"
helm list --namespace "$NS" -q >"$WORK/list.txt" || die "helm list"
if grep -qx "$REL" "$WORK/list.txt"; then die "helm list still shows $REL"; fi
say "nothing of the release left (its pods terminating)"
echo "helm: ok"
