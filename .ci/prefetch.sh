#!/usr/bin/env bash
# What .ci/run's later steps need besides the Rust build, from package registries and the Go
# module proxy, each a no-op once in its cache outside the clone, in three parts that .ci/run
# starts in the background before the Rust tools and build (so on a fresh machine the
# downloads and Go builds overlap the Rust ones) and waits for one by one, before the first
# check that needs each:
#   chart     the chart tools (helm, kubernetes-validate, hadolint, cert-manager schemas)
#   plane     the real control plane and KWOK (`cargo xtask control-plane build`)
#   drainers  the drainers (descheduler, Karpenter), the real load balancer (HAProxy from
#             Debian, CoreDNS) and promtool
#   bash .ci/prefetch.sh [chart|plane|drainers]   (no argument: all three, in that order)
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf 'prefetch: %s (%ss)\n' "$*" "$SECONDS"; }
part="${1:-all}"
case "$part" in
  chart | plane | drainers | all) ;;
  *) echo "prefetch: unknown part '$part' (chart, plane or drainers)" >&2; exit 2 ;;
esac
if [ "$part" = chart ] || [ "$part" = all ]; then
  step "chart tools"
  bash .ci/install-tools.sh
fi
if [ "$part" = plane ] || [ "$part" = all ]; then
  step "control plane and KWOK"
  cargo xtask control-plane build
fi
if [ "$part" = drainers ] || [ "$part" = all ]; then
  step "drainers"
  bash .ci/drainers.sh
  step "load balancer (HAProxy, CoreDNS)"
  bash .ci/balancers.sh
  step "promtool"
  bash .ci/checks/alerts.sh --build-only
fi
step "done"
