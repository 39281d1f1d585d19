#!/usr/bin/env bash
# Installs everything this repo needs on a machine, idempotently:
#   - Debian packages: prometheus (brings promtool), util-linux (unshare), and
#     for the real node containerd, runc, the CNI plugins, buildah, mmdebstrap,
#     and redis-server (the shared quota windows)
#   - Go-built binaries: kube-apiserver, kube-controller-manager,
#     kube-scheduler, kubelet, etcd, MinIO and helm, what the sandbox runs
#     (hack/build-binaries.sh; `make lint` and `make test` build the rest they
#     need: kubeconform, the Prometheus Operator's CRDs, Jaeger and Kueue)
#   - a Python venv in .venv with the project installed editable with every extra
#     and the `dev` dependency group, pinned by hack/constraints.txt, and the
#     test bed package (hack/) on its path
#   - the images the real node runs, built from deploy/images/ without a Docker
#     engine (hack/build-images.sh)
# A second run finds everything in place and takes seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
log() { printf '[setup] %s\n' "$*" >&2; }
started=$SECONDS

# --- Debian packages -----------------------------------------------------------
apt_packages=(prometheus util-linux containerd runc containernetworking-plugins buildah mmdebstrap redis-server)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  # The prometheus and containerd packages start system services; the test
  # bed runs its own on free ports, so keep the packaged ones from starting.
  echo exit 101 | $SUDO tee /usr/sbin/policy-rc.d >/dev/null && $SUDO chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  $SUDO rm -f /usr/sbin/policy-rc.d
fi

# --- Go binaries beside the Python venv and the images ---------------------------
# The Go builds keep the CPU busy; pip, mmdebstrap and the image builds mostly wait on the network and the
# disk: side by side, a cold set-up takes about as long as the Go builds alone.
timed() { # timed WHAT COMMAND...: runs it and says how long it took (where a cold set-up's time goes)
  local what="$1" began=$SECONDS
  shift
  "$@"
  [[ $((SECONDS - began)) -lt 2 ]] || log "$what: ready in $((SECONDS - began))s"  # silent when all was cached
}

python_venv() {
  local stamp want site
  stamp="$VENV/.durablerun-setup"
  want="$(cat "$ROOT/pyproject.toml" "$ROOT/hack/constraints.txt" | sha256sum | cut -d' ' -f1)"
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    log "installing Python dependencies (pinned by hack/constraints.txt)"
    "$VENV/bin/pip" install -q --upgrade "pip==25.3"
    # Every extra of the package, and the repository's tools (the `dev` dependency group,
    # which is not part of the package's metadata).
    "$VENV/bin/pip" install -q -c "$ROOT/hack/constraints.txt" -e "$ROOT[s3,pod,operator,otel,quotas]" \
      --group "$ROOT/pyproject.toml:dev"
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    # The test bed (process node, control plane, MinIO) is a dev tool, not part
    # of the wheel: put hack/ on the venv's path.
    echo "$ROOT/hack" >"$site/durablerun-testbed.pth"
    echo "$want" >"$stamp"
  fi
}

python_and_images() {
  timed "Python venv" python_venv
  # The images need the venv: the chart's image references are read from its values with PyYAML.
  timed "images" "$ROOT/hack/build-images.sh"
}

timed "Go binaries" "$ROOT/hack/build-binaries.sh" & go_pid=$!
python_and_images & python_pid=$!
failed=0
wait "$go_pid" || failed=1
wait "$python_pid" || failed=1
[[ $failed -eq 0 ]] || { log "set-up failed: see the messages above"; exit 1; }

log "ready in $((SECONDS - started))s"
