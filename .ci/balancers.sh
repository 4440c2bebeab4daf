#!/usr/bin/env bash
# The real load balancer of the real tier (crates/real-lb) and the DNS it resolves through,
# each installed once, and prints where they are:
#   haproxy   Debian's package (2.6 on bookworm), `apt-get install haproxy`, when no haproxy
#             is found ($GRACEFUL_DRAIN_HAPROXY, PATH, /usr/sbin/haproxy); with sudo unless
#             root
#   coredns   github.com/coredns/coredns v1.15.0 from the Go module proxy, built into the
#             cache outside the clone ($GRACEFUL_DRAIN_CACHE, else
#             $XDG_CACHE_HOME/graceful-drain, else ~/.cache/graceful-drain)/tools/coredns,
#             unless $GRACEFUL_DRAIN_COREDNS names one
# A no-op when both are there; the CoreDNS build takes about 2 minutes on two cores with an
# empty Go build cache (129 s, its modules already downloaded), 12 s with a warm one.
#   bash .ci/balancers.sh           install or build if missing; prints HAPROXY=<path> and
#                                   COREDNS=<path>
set -euo pipefail
cd "$(dirname "$0")/.."

COREDNS_VERSION="v1.15.0"
CACHE="${GRACEFUL_DRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/graceful-drain}"
TOOLS="$CACHE/tools"

die() { printf 'balancers: FAIL %s\n' "$*" >&2; exit 1; }

find_haproxy() {
  if [ -n "${GRACEFUL_DRAIN_HAPROXY:-}" ]; then
    [ -x "$GRACEFUL_DRAIN_HAPROXY" ] || die "\$GRACEFUL_DRAIN_HAPROXY=$GRACEFUL_DRAIN_HAPROXY is not executable"
    echo "$GRACEFUL_DRAIN_HAPROXY"
  elif command -v haproxy >/dev/null 2>&1; then
    command -v haproxy
  elif [ -x /usr/sbin/haproxy ]; then
    echo /usr/sbin/haproxy
  fi
}

HAPROXY="$(find_haproxy)"
if [ -z "$HAPROXY" ]; then
  echo "balancers: installing haproxy from Debian" >&2
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  started=$SECONDS
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || die "apt-get update"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends haproxy >&2 ||
    die "apt-get install haproxy"
  echo "balancers: haproxy installed in $((SECONDS - started)) s" >&2
  HAPROXY="$(find_haproxy)"
  [ -n "$HAPROXY" ] || die "haproxy is still not found after apt-get install"
fi
version="$("$HAPROXY" -v 2>&1)" || die "$HAPROXY does not run"
version="${version%%$'\n'*}"
# crates/real-lb writes HAProxy 2.6's defaults out; another release is used, but said.
case "$version" in
  *"version 2.6."*) ;;
  *) echo "balancers: note: $version is not the 2.6 the configuration was written for" >&2 ;;
esac

if [ -n "${GRACEFUL_DRAIN_COREDNS:-}" ]; then
  COREDNS="$GRACEFUL_DRAIN_COREDNS"
  [ -x "$COREDNS" ] || die "\$GRACEFUL_DRAIN_COREDNS=$COREDNS is not executable"
else
  COREDNS="$TOOLS/coredns"
fi
if [ ! -x "$COREDNS" ]; then
  echo "balancers: building coredns $COREDNS_VERSION into $COREDNS" >&2
  # A scratch module requiring CoreDNS builds its main package as a dependency; CoreDNS
  # v1.15.0 needs Go >= 1.26.0 (GOTOOLCHAIN=auto fetches it from the module proxy when the
  # local Go is older).
  SRC="$TOOLS/coredns-src"
  rm -rf "$SRC"
  mkdir -p "$SRC"
  started=$SECONDS
  (
    cd "$SRC"
    cat >go.mod <<MOD
module graceful-drain.local/coredns-build

go 1.26.0
MOD
    export GOFLAGS=-mod=mod GOTOOLCHAIN=auto CGO_ENABLED=0
    # Its list of the two hundred modules it adds is said only when it fails.
    out="$(go get "github.com/coredns/coredns@$COREDNS_VERSION" 2>&1)" || { echo "$out"; exit 1; }
    go build -trimpath -o "$COREDNS.tmp" github.com/coredns/coredns
  ) >&2 || die "go build github.com/coredns/coredns@$COREDNS_VERSION"
  mv -f "$COREDNS.tmp" "$COREDNS"
  echo "balancers: coredns built in $((SECONDS - started)) s" >&2
fi
version="$("$COREDNS" -version 2>&1)" || die "$COREDNS does not run"
case "$version" in
  *"CoreDNS-${COREDNS_VERSION#v}"*) ;;
  *) echo "balancers: note: $COREDNS is not CoreDNS $COREDNS_VERSION: $version" >&2 ;;
esac
echo "HAPROXY=$HAPROXY"
echo "COREDNS=$COREDNS"
