#!/usr/bin/env bash
# The chart's least-privilege policies on a real kube-apiserver (RBAC and admission
# enforced): every write the webhook's and the node agents' ServiceAccounts must not make is
# tried and must be refused, and every write they need must pass.
#   bash .ci/checks/policies-real.sh [XTASK]   (XTASK defaults to target/debug/xtask)
set -euo pipefail
cd "$(dirname "$0")/../.."
eval "$(bash .ci/install-tools.sh --print-env)"
XTASK="${1:-${CARGO_TARGET_DIR:-target}/debug/xtask}"
[ -x "$XTASK" ] || { echo "policies-real: FAIL $XTASK not built (cargo build -p xtask)" >&2; exit 1; }
WORK="$(mktemp -d)"
CP="$WORK/cp"
cleanup() { "$XTASK" control-plane down "$CP" >/dev/null 2>&1 || true; [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"; }
trap cleanup EXIT
die() { printf 'policies-real: FAIL %s\n' "$*" >&2; [ -d "$CP/logs" ] && tail -n 20 "$CP"/logs/kube-apiserver.log >&2; exit 1; }

"$XTASK" control-plane up "$CP" >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; die "control plane did not start"; }
ADMIN="$CP/admin.kubeconfig"
k() { kubectl --kubeconfig "$ADMIN" "$@"; }
NS=graceful-drain
k create namespace "$NS" >/dev/null
k create namespace shop >/dev/null
# Pods need the namespace's default ServiceAccount, which kube-controller-manager creates a
# moment after the namespace; create it now if it is not there yet.
k -n shop create serviceaccount default >/dev/null 2>&1 || true
# The chart as deploy/graceful-drain.yaml renders it: RBAC and admission policies only.
helm template graceful-drain charts/graceful-drain --namespace "$NS" \
  --set certificates.mode=self-signed >"$WORK/chart.yaml"
python3 - "$WORK/chart.yaml" >"$WORK/apply.yaml" <<'PY'
import sys, yaml
keep = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "FlowSchema"}
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") in keep]
print(yaml.safe_dump_all(docs))
PY
k apply -f "$WORK/apply.yaml" >/dev/null
for n in node-a node-b; do
  k create -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata: {name: $n, labels: {kubernetes.io/hostname: $n}}
EOF
done

# A kubeconfig acting as a ServiceAccount (impersonated by the admin), optionally bound to
# a node the way a token projected into the agent's pod is.
as_user() { # FILE USER [NODE]
  python3 - "$ADMIN" "$1" "$2" "${3:-}" <<'PY'
import sys, yaml
admin, out, user, node = sys.argv[1:]
cfg = yaml.safe_load(open(admin))
u = cfg["users"][0]["user"]
u["as"] = user
if node:
    u["as-user-extra"] = {"authentication.kubernetes.io/node-name": [node]}
yaml.safe_dump(cfg, open(out, "w"))
PY
}
WEBHOOK="$WORK/webhook.kubeconfig"; as_user "$WEBHOOK" "system:serviceaccount:$NS:graceful-drain-webhook"
AGENT_B="$WORK/agent-b.kubeconfig"; as_user "$AGENT_B" "system:serviceaccount:$NS:graceful-drain-agent" node-b
AGENT_A="$WORK/agent-a.kubeconfig"; as_user "$AGENT_A" "system:serviceaccount:$NS:graceful-drain-agent" node-a
AGENT_NONE="$WORK/agent-none.kubeconfig"; as_user "$AGENT_NONE" "system:serviceaccount:$NS:graceful-drain-agent"

# A node agent may patch nodes/status but not read it, and kubectl's `patch --subresource`
# reads first: this sends the PATCH alone, as the agent does, through the kubeconfig FILE
# (its client certificate and impersonation), printing the API server's answer.
status_patch() { # FILE NODE STRATEGIC-MERGE-PATCH
  python3 - "$@" <<'PY'
import base64, json, ssl, sys, tempfile, urllib.request, urllib.error, yaml
path, node, body = sys.argv[1:]
cfg = yaml.safe_load(open(path))
cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
files = {}
for key in ("certificate-authority-data", "client-certificate-data", "client-key-data"):
    f = tempfile.NamedTemporaryFile(delete=False)
    f.write(base64.b64decode(user.get(key) or cluster[key])); f.close(); files[key] = f.name
ctx = ssl.create_default_context(cafile=files["certificate-authority-data"])
ctx.load_cert_chain(files["client-certificate-data"], files["client-key-data"])
req = urllib.request.Request(f"{cluster['server']}/api/v1/nodes/{node}/status", data=body.encode(),
                             method="PATCH", headers={"Content-Type": "application/strategic-merge-patch+json"})
if "as" in user:
    req.add_header("Impersonate-User", user["as"])
for k, values in (user.get("as-user-extra") or {}).items():
    for v in values:
        req.add_header(f"Impersonate-Extra-{k.replace('/', '%2F')}", v)
try:
    urllib.request.urlopen(req, context=ctx).read()
    print("patched")
except urllib.error.HTTPError as e:
    print(f"{e.code}: {e.read().decode()}")
    sys.exit(1)
PY
}
pod() { # NAME NODE
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: shop
  labels: {app: web, pod-template-hash: abc, team: a}
  annotations: {note: mine}
spec:
  nodeName: $2
  containers: [{name: c, image: registry.example/web:1}]
EOF
}
pass=0
# kubectl cordon reports a refusal but exits 0, so the answer is read from the output too.
refused() { # DESCRIPTION KUBECONFIG ARGS...
  local what="$1" cfg="$2" out; shift 2
  out="$(kubectl --kubeconfig "$cfg" "$@" 2>&1)" || true
  grep -qi "forbidden\|denied" <<<"$out" || die "$what: not refused: $out"
  printf '  refused: %s\n' "$what"; pass=$((pass + 1))
}
allowed() { # DESCRIPTION KUBECONFIG ARGS...
  local what="$1" cfg="$2" out; shift 2
  out="$(kubectl --kubeconfig "$cfg" "$@" 2>&1)" || die "$what: failed: $out"
  ! grep -qi "forbidden\|denied" <<<"$out" || die "$what: refused: $out"
  printf '  allowed: %s\n' "$what"; pass=$((pass + 1))
}
ISOLATE='[{"op":"remove","path":"/metadata/labels/app"},{"op":"remove","path":"/metadata/labels/pod-template-hash"},
 {"op":"add","path":"/metadata/labels/graceful-drain.io~1draining","value":"web"},
 {"op":"add","path":"/metadata/annotations/graceful-drain.io~1original-labels","value":"{\"app\":\"web\",\"pod-template-hash\":\"abc\"}"},
 {"op":"add","path":"/metadata/annotations/graceful-drain.io~1delete-at","value":"2026-01-01T00:00:00Z"}'
# Isolated for a caller (evictions, DELETEs by people): restored if the caller never comes.
ISOLATE_CALLER="$ISOLATE"',{"op":"add","path":"/metadata/annotations/graceful-drain.io~1restore-at","value":"2026-01-01T00:01:00Z"}]'
# An isolation recording a label the pod never had, to "restore" it later.
ISOLATE_FAKE='[{"op":"remove","path":"/metadata/labels/app"},
 {"op":"add","path":"/metadata/labels/graceful-drain.io~1draining","value":"web"},
 {"op":"add","path":"/metadata/annotations/graceful-drain.io~1original-labels","value":"{\"admin\":\"yes\",\"app\":\"web\"}"},
 {"op":"add","path":"/metadata/annotations/graceful-drain.io~1delete-at","value":"2026-01-01T00:00:00Z"}]'
# Isolated for a ReplicaSet scale-down (the webhook deletes it once due).
ISOLATE_SCALE_DOWN="$ISOLATE]"
RESTORE='[{"op":"remove","path":"/metadata/labels/graceful-drain.io~1draining"},
 {"op":"add","path":"/metadata/labels/app","value":"web"},{"op":"add","path":"/metadata/labels/pod-template-hash","value":"abc"},
 {"op":"remove","path":"/metadata/annotations/graceful-drain.io~1original-labels"},
 {"op":"remove","path":"/metadata/annotations/graceful-drain.io~1delete-at"},
 {"op":"remove","path":"/metadata/annotations/graceful-drain.io~1restore-at"}]'

echo "policies-real: the webhook's ServiceAccount"
pod web-1 node-a
# Policies take effect once the API server's policy informer has loaded them (about a
# second): wait until a server-side dry run of a forbidden change is refused (at most 30 s).
for _ in $(seq 1 60); do
  kubectl --kubeconfig "$WEBHOOK" -n shop label pod web-1 team=b --overwrite --dry-run=server >/dev/null 2>&1 || break
  sleep 0.5
done
k get validatingadmissionpolicies -o jsonpath='{range .items[*]}{.metadata.name}: {.status.typeChecking}{"\n"}{end}'
refused "change a pod's image" "$WEBHOOK" -n shop patch pod web-1 --type=json \
  -p '[{"op":"replace","path":"/spec/containers/0/image","value":"registry.example/evil:1"}]'
refused "set an arbitrary label" "$WEBHOOK" -n shop label pod web-1 team=b --overwrite
refused "change an annotation not ours" "$WEBHOOK" -n shop annotate pod web-1 note=theirs --overwrite
refused "delete a pod it did not isolate" "$WEBHOOK" -n shop delete pod web-1 --wait=false
k -n shop create deployment web --image=registry.example/web:1 --replicas=0 >/dev/null
refused "change another Deployment" "$WEBHOOK" -n shop scale deployment web --replicas=0
refused "set a delete time on a pod it does not isolate" "$WEBHOOK" -n shop patch pod web-1 --type=json \
  -p '[{"op":"add","path":"/metadata/annotations/graceful-drain.io~1delete-at","value":"2026-01-01T00:00:00Z"}]'
refused "isolate recording labels that were never there" "$WEBHOOK" -n shop patch pod web-1 --type=json -p "$ISOLATE_FAKE"
allowed "isolate a pod (remove its labels, add ours)" "$WEBHOOK" -n shop patch pod web-1 --type=json -p "$ISOLATE_CALLER"
refused "rewrite the recorded labels of an isolated pod" "$WEBHOOK" -n shop patch pod web-1 --type=json \
  -p '[{"op":"replace","path":"/metadata/annotations/graceful-drain.io~1original-labels","value":"{\"admin\":\"yes\"}"}]'
refused "drop the restore time of an isolated pod" "$WEBHOOK" -n shop patch pod web-1 --type=json \
  -p '[{"op":"remove","path":"/metadata/annotations/graceful-drain.io~1restore-at"}]'
refused "restore with a label that was never there" "$WEBHOOK" -n shop patch pod web-1 --type=json \
  -p '[{"op":"remove","path":"/metadata/labels/graceful-drain.io~1draining"},{"op":"add","path":"/metadata/labels/admin","value":"yes"}]'
allowed "restore the recorded labels" "$WEBHOOK" -n shop patch pod web-1 --type=json -p "$RESTORE"
[ "$(k -n shop get pod web-1 -o jsonpath='{.metadata.labels}')" = '{"app":"web","pod-template-hash":"abc","team":"a"}' ] \
  || die "restored labels: $(k -n shop get pod web-1 -o jsonpath='{.metadata.labels}')"
# Karpenter's do-not-disrupt: added only while isolating (recorded), removed only while
# restoring a pod that records it; a user's own value is never touched.
DND='{"op":"add","path":"/metadata/annotations/karpenter.sh~1do-not-disrupt","value":"true"}'
DND_SET='{"op":"add","path":"/metadata/annotations/graceful-drain.io~1do-not-disrupt-set","value":"true"}'
refused "mark a pod it does not isolate do-not-disrupt" "$WEBHOOK" -n shop patch pod web-1 --type=json \
  -p "[$DND,$DND_SET]"
allowed "isolate a pod and mark it do-not-disrupt" "$WEBHOOK" -n shop patch pod web-1 --type=json \
  -p "${ISOLATE_CALLER%]},$DND,$DND_SET]"
allowed "restore it, removing the mark it recorded" "$WEBHOOK" -n shop patch pod web-1 --type=json \
  -p "${RESTORE%]},"'{"op":"remove","path":"/metadata/annotations/karpenter.sh~1do-not-disrupt"},{"op":"remove","path":"/metadata/annotations/graceful-drain.io~1do-not-disrupt-set"}]'
k -n shop annotate pod web-1 karpenter.sh/do-not-disrupt=10m >/dev/null
allowed "isolate a pod the user marked do-not-disrupt" "$WEBHOOK" -n shop patch pod web-1 --type=json -p "$ISOLATE_CALLER"
refused "remove the user's do-not-disrupt while restoring" "$WEBHOOK" -n shop patch pod web-1 --type=json \
  -p "${RESTORE%]},"'{"op":"remove","path":"/metadata/annotations/karpenter.sh~1do-not-disrupt"}]'
allowed "restore it, the user's do-not-disrupt kept" "$WEBHOOK" -n shop patch pod web-1 --type=json -p "$RESTORE"
[ "$(k -n shop get pod web-1 -o jsonpath='{.metadata.annotations.karpenter\.sh/do-not-disrupt}')" = 10m ] \
  || die "the user's do-not-disrupt was not kept"
k -n shop annotate pod web-1 karpenter.sh/do-not-disrupt- >/dev/null
allowed "isolate for a ReplicaSet scale-down" "$WEBHOOK" -n shop patch pod web-1 --type=json \
  -p "$ISOLATE_SCALE_DOWN"
allowed "delete the pod it isolated for a scale-down" "$WEBHOOK" -n shop delete pod web-1 --wait=false
k -n shop create poddisruptionbudget web --selector=app=web --min-available=1 >/dev/null
for _ in $(seq 1 60); do # the disruption controller writes its status (at most 30 s)
  [ -n "$(k -n shop get pdb web -o jsonpath='{.status.observedGeneration}')" ] && break
  sleep 0.5
done
status_with() { # PYTHON-EXPRESSION-ON-status
  k -n shop get pdb web -o json | python3 -c "import json,sys; p=json.load(sys.stdin); s=p['status']; $1; print(json.dumps(p))" >"$WORK/pdb.json"
}
status_with "s['currentHealthy'] = 99"
refused "change a PDB's healthy count" "$WEBHOOK" replace --subresource=status -f "$WORK/pdb.json"
# A disruption recorded as the API server's eviction records one (by the administrator:
# with no kubelet here no pod is healthy, so disruptionsAllowed stays 0 and the webhook
# could not take one from it).
# Times are now's: the disruption controller drops an entry older than two minutes.
pod web-4 node-a
now() { date -u +%Y-%m-%dT%H:%M:%SZ; }
status_with "s['disruptedPods'] = {'web-4': '$(now)'}; s['disruptionsAllowed'] = 0"
k replace --subresource=status -f "$WORK/pdb.json" >/dev/null
sleep 1 # a later second for the renewal
status_with "s['disruptedPods'] = {'web-4': '$(now)'}"
allowed "renew a held pod's disruption time" "$WEBHOOK" replace --subresource=status -f "$WORK/pdb.json"
status_with "s['disruptionsAllowed'] = s.get('disruptionsAllowed', 0) + 5"
refused "raise a PDB's disruptionsAllowed with no disruption given back" "$WEBHOOK" replace --subresource=status -f "$WORK/pdb.json"
status_with "s['disruptedPods']['web-8'] = '$(now)'"
refused "record a disruption without taking it from disruptionsAllowed" "$WEBHOOK" replace --subresource=status -f "$WORK/pdb.json"
status_with "s['disruptedPods'] = {}; s['disruptionsAllowed'] = s.get('disruptionsAllowed', 0) + 1"
allowed "give back a disruption it recorded" "$WEBHOOK" replace --subresource=status -f "$WORK/pdb.json"

echo "policies-real: namespaces the webhook never handles, controller references"
k -n kube-system create serviceaccount default >/dev/null 2>&1 || true
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: kube-system
  labels: {app: web, pod-template-hash: abc}
spec:
  nodeName: node-a
  containers: [{name: c, image: registry.example/web:1}]
EOF
refused "isolate a pod in kube-system" "$WEBHOOK" -n kube-system patch pod web-1 --type=json -p "$ISOLATE_CALLER"
pod web-5 node-a
HANDOVER='{"op":"add","path":"/metadata/ownerReferences","value":[{"apiVersion":"apps/v1","kind":"Deployment","name":"web","uid":"00000000-0000-0000-0000-000000000001","controller":true}]}'
refused "isolate a pod handing it to a Deployment no ReplicaSet of it is named after" "$WEBHOOK" -n shop patch pod web-5 \
  --type=json -p "${ISOLATE_CALLER%]},$HANDOVER]"

echo "policies-real: the isolation record (whoever may patch pods)"
k -n shop create serviceaccount tenant >/dev/null
k -n shop create role pod-writer --verb=get,list,create,patch,update --resource=pods >/dev/null
k -n shop create rolebinding tenant-pod-writer --role=pod-writer --serviceaccount=shop:tenant >/dev/null
TENANT="$WORK/tenant.kubeconfig"; as_user "$TENANT" "system:serviceaccount:shop:tenant"
allowed "label a pod (tenant)" "$TENANT" -n shop label pod web-5 team=b --overwrite
refused "put an isolation record with a past delete time on a pod (the deleter would remove it)" "$TENANT" \
  -n shop patch pod web-5 --type=json -p "$ISOLATE_SCALE_DOWN"
refused "label a pod graceful-drain.io/draining" "$TENANT" -n shop label pod web-5 graceful-drain.io/draining=web
PLANTED="$WORK/planted.yaml"
cat >"$PLANTED" <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: planted
  namespace: shop
  labels: {graceful-drain.io/draining: web}
  annotations: {graceful-drain.io/original-labels: "{}", graceful-drain.io/delete-at: "2026-01-01T00:00:00Z"}
spec:
  nodeName: node-a
  containers: [{name: c, image: registry.example/web:1}]
EOF
refused "create a pod carrying an isolation record" "$TENANT" create -f "$PLANTED"
allowed "isolate a pod (the webhook)" "$WEBHOOK" -n shop patch pod web-5 --type=json -p "$ISOLATE_CALLER"
refused "move the delete time of an isolated pod" "$TENANT" -n shop annotate pod web-5 \
  graceful-drain.io/delete-at=2025-01-01T00:00:00Z --overwrite
refused "drop an isolated pod's restore time (the deleter would remove it)" "$TENANT" -n shop annotate pod web-5 \
  graceful-drain.io/restore-at-
allowed "remove the isolation record from a pod" "$TENANT" -n shop label pod web-5 graceful-drain.io/draining-

echo "policies-real: the webhook's own RBAC objects"
OTHER='{"kind":"ServiceAccount","name":"default","namespace":"shop"}'
refused "add a subject to its own ClusterRoleBinding" "$WEBHOOK" patch clusterrolebinding graceful-drain-webhook \
  --type=json -p '[{"op":"add","path":"/subjects/-","value":'"$OTHER"'}]'
refused "add a subject to its leader-election RoleBinding" "$WEBHOOK" -n "$NS" patch rolebinding \
  graceful-drain-webhook-leader-election --type=json -p '[{"op":"add","path":"/subjects/-","value":'"$OTHER"'}]'
refused "add a rule it holds to its ClusterRole" "$WEBHOOK" patch clusterrole graceful-drain-webhook \
  --type=json -p '[{"op":"add","path":"/rules/-","value":{"apiGroups":[""],"resources":["pods"],"verbs":["get"]}}]'
refused "label its ClusterRole into the admin role's aggregation" "$WEBHOOK" label clusterrole graceful-drain-webhook \
  rbac.authorization.k8s.io/aggregate-to-admin=true
BINDING_UID="$(k get clusterrolebinding graceful-drain-webhook -o jsonpath='{.metadata.uid}')"
allowed "make its ClusterRole a dependent of its ClusterRoleBinding" "$WEBHOOK" patch clusterrole graceful-drain-webhook \
  --type=merge -p '{"metadata":{"ownerReferences":[{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","name":"graceful-drain-webhook","uid":"'"$BINDING_UID"'"}]}}'
allowed "release its finalizer from its ClusterRoleBinding" "$WEBHOOK" patch clusterrolebinding graceful-drain-webhook \
  --type=json -p '[{"op":"remove","path":"/metadata/finalizers"}]'
[ "$(k get clusterrolebinding graceful-drain-webhook -o jsonpath='{.subjects[*].name}')" = graceful-drain-webhook ] \
  || die "the ClusterRoleBinding's subjects changed: $(k get clusterrolebinding graceful-drain-webhook -o jsonpath='{.subjects}')"

echo "policies-real: a node agent's ServiceAccount, bound to node-b"
pod web-2 node-a
refused "cordon another node" "$AGENT_B" cordon node-a
refused "label another node" "$AGENT_B" label node node-a graceful-drain.io/x=y
refused "delete a pod on another node" "$AGENT_B" -n shop delete pod web-2 --wait=false
refused "cordon a node with a token that names no node" "$AGENT_NONE" cordon node-b
refused "delete a pod with a token that names no node" "$AGENT_NONE" -n shop delete pod web-2 --wait=false
allowed "cordon its own node" "$AGENT_B" cordon node-b
allowed "exclude its own node from external load balancers" "$AGENT_B" label node node-b \
  node.kubernetes.io/exclude-from-external-load-balancers=true
allowed "record its drain on its own node" "$AGENT_B" annotate node node-b graceful-drain.io/drain-event=drain-1 \
  graceful-drain.io/excluded-from-lb=true
out="$(status_patch "$AGENT_B" node-b '{"status":{"conditions":[{"type":"DrainInProgress","status":"True","reason":"Draining","message":"listing pods"}]}}')" \
  || die "set its DrainInProgress condition: $out"
printf '  allowed: set its DrainInProgress condition\n'; pass=$((pass + 1))
refused "label its own node for workloads' affinities" "$AGENT_B" label node node-b team=payments
refused "remove a label of its own node" "$AGENT_B" label node node-b kubernetes.io/hostname-
refused "annotate its own node outside graceful-drain's annotations" "$AGENT_B" annotate node node-b note=x
refused "taint its own node" "$AGENT_B" taint node node-b evil=yes:NoSchedule
refused "give its own node an owner for the garbage collector" "$AGENT_B" patch node node-b --type=merge \
  -p '{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"00000000-0000-0000-0000-000000000000"}]}}'
for what_patch in 'set a condition of the kubelet on its own node|{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Evil","message":"x"}]}}' \
  'change its own node'"'"'s capacity|{"status":{"capacity":{"pods":"1000"}}}'; do
  out="$(status_patch "$AGENT_B" node-b "${what_patch#*|}")" && die "${what_patch%%|*}: not refused: $out"
  grep -qi "forbidden\|denied" <<<"$out" || die "${what_patch%%|*}: $out"
  printf '  refused: %s\n' "${what_patch%%|*}"; pass=$((pass + 1))
done
allowed "uncordon its own node" "$AGENT_B" uncordon node-b
allowed "delete a pod on its own node (agent on node-a)" "$AGENT_A" -n shop delete pod web-2 --wait=false
echo "policies-real: API Priority and Fairness"
# kube-apiserver names the FlowSchema that classified each request in a response header.
classified_by() { # KUBECONFIG
  kubectl --kubeconfig "$1" -n shop get pods -v=8 2>&1 | tr -d '\r' \
    | sed -n 's/.*X-Kubernetes-Pf-Flowschema-Uid:[^0-9a-f]*\([0-9a-f-]\{36\}\).*/\1/Ip' | head -n 1
}
flowschema_uid() { k get flowschema "$1" -o jsonpath='{.metadata.uid}'; }
[ "$(classified_by "$WEBHOOK")" = "$(flowschema_uid graceful-drain-webhook)" ] \
  || die "the webhook's requests are not classified by the chart's FlowSchema graceful-drain-webhook"
[ "$(k get flowschema graceful-drain-webhook -o jsonpath='{.spec.priorityLevelConfiguration.name}')" = workload-high ] \
  || die "the chart's FlowSchema does not use workload-high"
printf '  classified: the webhook'"'"'s requests by FlowSchema graceful-drain-webhook (workload-high)\n'; pass=$((pass + 1))
[ "$(classified_by "$AGENT_B")" = "$(flowschema_uid service-accounts)" ] \
  || die "the agents' requests left the built-in service-accounts FlowSchema"
printf '  classified: the agents'"'"' requests by the built-in service-accounts FlowSchema\n'; pass=$((pass + 1))
echo "policies-real: ok ($pass checks)"
