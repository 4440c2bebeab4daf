#!/usr/bin/env bash
# The scenario matrix on the real control plane: `graceful-drain simulate --real --matrix`
# runs a scenario of the matrix on a fresh kube-apiserver, kube-controller-manager and
# kube-scheduler v1.37 with etcd (built into the cache by `cargo xtask control-plane build`,
# which `.ci/run` runs first) for each row, the simulator playing only kubelets, load
# balancers and traffic; same columns and expectations as `matrix.sh`, with the
# EvictionRequest API on. The whole matrix takes about 15 minutes on the 2-core CI machine, so
# CI runs the scenarios whose outcome the real controllers decide beyond what `real.sh`'s
# rows already show (the ReplicaSet under a full PDB, two drains at once, restarts of our
# components mid-drain, StatefulSet and DaemonSet rolling updates, the Job controller's
# podFailurePolicy, priority tiers, VM hooks); set MATRIX_REAL=all for every scenario.
#   bash .ci/checks/matrix-real.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${GRACEFUL_DRAIN_BIN:-${CARGO_TARGET_DIR:-target}/debug/graceful-drain}"
[ -x "$BIN" ] || cargo build -q --locked --features sim --bin graceful-drain
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
if [ "${MATRIX_REAL:-}" = all ]; then
  selection=(--matrix)
else
  selection=()
  for s in pdb-full-rollout two-nodes-drain agent-restart-drain webhook-rollout-drain \
    statefulset-rollout daemonset-drain daemonset-rollout job-drain tiered-drain vm-evacuation-drain; do
    selection+=(--scenario "$s")
  done
fi
if ! RUST_LOG=error NO_COLOR=1 "$BIN" simulate --real "${selection[@]}" 2> >(tee "$LOG" | grep -a '^\[\|^running\|not run' >&2); then
  echo "matrix-real: FAIL (last log lines follow)" >&2
  tail -n 60 "$LOG" >&2
  exit 1
fi
echo "matrix-real: ok"
