#!/usr/bin/env bash
# Installs what the benchmarks need, idempotently (a second run takes a second):
#   - the test bed (hack/setup.sh: kube-apiserver, etcd, MinIO, the dev venv)
#   - Debian's PostgreSQL server (the benchmark starts its own throwaway cluster
#     on loopback in a temp dir; the packaged service is kept from starting)
#   - bench/.venv: the project (-e .[s3,pod,operator,otel]) plus DBOS, LangGraph and their
#     checkpointers, every version pinned by bench/constraints.txt. A venv of its
#     own, so the dev venv that the test suite uses is never changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCH="$ROOT/bench"
VENV="$BENCH/.venv"
PYTHON="${PYTHON:-python3}"
log() { printf '[bench-setup] %s\n' "$*" >&2; }

"$ROOT/hack/setup.sh"

# --- PostgreSQL ------------------------------------------------------------------
if ! dpkg-query -W -f='${Status}' postgresql 2>/dev/null | grep -q "install ok installed"; then
  log "installing Debian's postgresql"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  echo exit 101 | $SUDO tee /usr/sbin/policy-rc.d >/dev/null && $SUDO chmod +x /usr/sbin/policy-rc.d
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  $SUDO rm -f /usr/sbin/policy-rc.d
fi

# --- the bench venv ----------------------------------------------------------------
stamp="$VENV/.bench-setup"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/hack/constraints.txt" "$BENCH/requirements.txt" \
        "$BENCH/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  log "installing the benchmark's Python packages (pinned by bench/constraints.txt)"
  "$VENV/bin/pip" install -q --upgrade "pip==25.3"
  "$VENV/bin/pip" install -q -c "$BENCH/constraints.txt" -e "$ROOT[s3,pod,operator,otel,quotas]" -r "$BENCH/requirements.txt"
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # The harness (bench/) and the test bed (hack/) are not part of the wheel.
  printf '%s\n%s\n' "$BENCH" "$ROOT/hack" >"$site/durablerun-bench.pth"
  echo "$want" >"$stamp"
fi
log "ready"
