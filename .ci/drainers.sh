#!/usr/bin/env bash
# Builds the drainers the real tier runs besides kubectl into the cache outside the clone
# ($GRACEFUL_DRAIN_CACHE, else $XDG_CACHE_HOME/graceful-drain, else ~/.cache/graceful-drain),
# once, from the modules the Go module proxy serves, and prints where they are:
#   descheduler   sigs.k8s.io/descheduler v0.36.0 (cmd/descheduler)
# A no-op when they are built.
#   bash .ci/drainers.sh            build if missing; prints DESCHEDULER=<path>
set -euo pipefail
cd "$(dirname "$0")/.."

DESCHEDULER_VERSION="v0.36.0"
CACHE="${GRACEFUL_DRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/graceful-drain}"
DIR="$CACHE/tools/descheduler-$DESCHEDULER_VERSION"
BIN="$DIR/descheduler"

die() { printf 'drainers: FAIL %s\n' "$*" >&2; exit 1; }

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
"$BIN" version >/dev/null 2>&1 || "$BIN" --help >/dev/null 2>&1 || die "$BIN does not run"
echo "DESCHEDULER=$BIN"
