#!/usr/bin/env bash
# Builds the drainers the real tier runs besides kubectl into the cache outside the clone
# ($GRACEFUL_DRAIN_CACHE, else $XDG_CACHE_HOME/graceful-drain, else ~/.cache/graceful-drain),
# once, from the modules the Go module proxy serves, and prints where they are:
#   descheduler   sigs.k8s.io/descheduler v0.36.0 (cmd/descheduler)
#   karpenter     sigs.k8s.io/karpenter v1.15.0 with its KWOK cloud provider (kwok/), its
#                 CRDs beside it in crds/
# A no-op when they are built; the two build at once (each is mostly waiting on one core).
#   bash .ci/drainers.sh            build if missing; prints DESCHEDULER=<path> and
#                                   KARPENTER=<path>
set -euo pipefail
cd "$(dirname "$0")/.."

DESCHEDULER_VERSION="v0.36.0"
KARPENTER_VERSION="v1.15.0"
CACHE="${GRACEFUL_DRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/graceful-drain}"
DIR="$CACHE/tools/descheduler-$DESCHEDULER_VERSION"
BIN="$DIR/descheduler"
KDIR="$CACHE/tools/karpenter-kwok-$KARPENTER_VERSION"
KBIN="$KDIR/karpenter"

die() { printf 'drainers: FAIL %s\n' "$*" >&2; exit 1; }

build_karpenter() {
  echo "drainers: building karpenter $KARPENTER_VERSION (kwok provider) into $KDIR" >&2
  rm -rf "$KDIR.tmp"
  mkdir -p "$KDIR.tmp/src" "$KDIR.tmp/crds"
  local started=$SECONDS
  (
    cd "$KDIR.tmp/src"
    src="$(GOFLAGS=-mod=mod GOTOOLCHAIN=go1.27.3 go mod download -json "sigs.k8s.io/karpenter@$KARPENTER_VERSION" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
    # Karpenter binds its metrics and health ports on every interface (":PORT" in
    # pkg/operator/operator.go); servers here listen on loopback only, so the build uses a
    # copy of the module whose two bind addresses name 127.0.0.1, and nothing else changed.
    cp -r "$src" karpenter
    chmod -R u+w karpenter
    sed -i 's|fmt.Sprintf(":%d", options.FromContext(ctx).MetricsPort)|fmt.Sprintf("127.0.0.1:%d", options.FromContext(ctx).MetricsPort)|; s|fmt.Sprintf(":%d", options.FromContext(ctx).HealthProbePort)|fmt.Sprintf("127.0.0.1:%d", options.FromContext(ctx).HealthProbePort)|' \
      karpenter/pkg/operator/operator.go
    [ "$(grep -c '127.0.0.1:%d' karpenter/pkg/operator/operator.go)" = 2 ] || exit 1
    cp karpenter/kwok/charts/crds/*.yaml karpenter/kwok/apis/crds/*.yaml "$KDIR.tmp/crds/"
    cd karpenter
    GOFLAGS=-mod=mod GOTOOLCHAIN=go1.27.3 CGO_ENABLED=0 \
      go build -trimpath -o "$KDIR.tmp/karpenter" ./kwok
  ) || die "go build sigs.k8s.io/karpenter/kwok@$KARPENTER_VERSION"
  rm -rf "$KDIR.tmp/src" "$KDIR"
  mv "$KDIR.tmp" "$KDIR"
  echo "drainers: karpenter built in $((SECONDS - started)) s" >&2
}

karpenter_pid=""
if [ ! -x "$KBIN" ]; then
  build_karpenter &
  karpenter_pid=$!
fi

if [ ! -x "$BIN" ]; then
  echo "drainers: building descheduler $DESCHEDULER_VERSION into $DIR" >&2
  # The descheduler's go.mod pins k8s.io/kube-openapi with a `replace`, which a module that
  # requires it does not inherit: a scratch module requires it and copies that replace.
  # It needs Go >= 1.26.9 (GOTOOLCHAIN fetches go1.27.3 from the module proxy), and its
  # dependencies do not build with encoding/json/v2 on (GOEXPERIMENT=nojsonv2).
  rm -rf "$DIR.tmp"
  mkdir -p "$DIR.tmp/src"
  started=$SECONDS
  (
    cd "$DIR.tmp/src"
    cat >go.mod <<MOD
module graceful-drain.io/drainers

go 1.26.0

require sigs.k8s.io/descheduler $DESCHEDULER_VERSION
MOD
    modfile="$(GOFLAGS=-mod=mod GOTOOLCHAIN=go1.27.3 go mod download -json "sigs.k8s.io/descheduler@$DESCHEDULER_VERSION" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
    grep -E '^replace ' "$modfile" >>go.mod || true
    GOFLAGS=-mod=mod GOTOOLCHAIN=go1.27.3 GOEXPERIMENT=nojsonv2 CGO_ENABLED=0 \
      go build -trimpath -o "$DIR.tmp/descheduler" sigs.k8s.io/descheduler/cmd/descheduler
  ) || die "go build sigs.k8s.io/descheduler/cmd/descheduler@$DESCHEDULER_VERSION"
  rm -rf "$DIR.tmp/src" "$DIR"
  mv "$DIR.tmp" "$DIR"
  echo "drainers: descheduler built in $((SECONDS - started)) s" >&2
fi
if [ -n "$karpenter_pid" ]; then
  wait "$karpenter_pid" || die "karpenter build"
fi
"$BIN" version >/dev/null 2>&1 || "$BIN" --help >/dev/null 2>&1 || die "$BIN does not run"
[ -x "$KBIN" ] && ls "$KDIR"/crds/karpenter.sh_nodepools.yaml >/dev/null || die "$KDIR is incomplete"
echo "DESCHEDULER=$BIN"
echo "KARPENTER=$KBIN"
