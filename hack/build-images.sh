#!/usr/bin/env bash
# Builds the container images the test bed's real node runs, without a Docker
# engine or a registry, and caches each as an OCI archive keyed by a hash of
# its inputs (a second run with the same inputs builds nothing):
#
#   $DURABLERUN_CACHE/images/<name>-<hash>.tar   the image, `ctr images import`-able
#   .images/<name>.current (in this checkout)     "<archive path> <image reference>": the image
#                                                 built from this checkout's sources (checkouts
#                                                 share the cache, each has its own pointers)
#
# - python:   Debian bookworm with python3 (mmdebstrap), standing in for the
#             official python image the Dockerfiles default to (no registry here)
# - pause:    the pod sandbox image, from hack/pause
# - runner, operator: deploy/images/*.Dockerfile exactly as shipped, built with
#             only `--build-arg PYTHON_IMAGE=<the python image above>`, tagged
#             with the chart's default references so the chart runs them as is
# - examples: a workflow image FROM the runner image holding examples/, built
#             the way docs/install.md tells users to build theirs
#
# Usage: hack/build-images.sh [python|pause|runner|operator|examples ...] (default: all)
#        hack/build-images.sh workflow DIR REF   a user's workflow image from DIR
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DURABLERUN_CACHE:-$HOME/.cache/durable-run}"
OUT="$CACHE/images"
CURRENT="$ROOT/.images"
mkdir -p "$OUT" "$CURRENT"
log() { printf '[build-images] %s\n' "$*" >&2; }

# Bump when a recipe below changes in a way its inputs don't show.
RECIPE=1
PYTHON_PACKAGES=python3,python3-venv,python-is-python3,ca-certificates
PYTHON_REF=localhost/durable-run/python:3.11-bookworm

# The chart's default image references: a `helm install` with no image values
# finds these on the node and never pulls.
chart_image() {
  "$ROOT/.venv/bin/python" - "$ROOT/charts/durable-run" "$1" <<'PY'
import sys, yaml
chart, name = sys.argv[1], sys.argv[2]
values = yaml.safe_load(open(f"{chart}/values.yaml"))
image = values["image"] if name == "operator" else values["runner"]["image"]
print(f'{image["repository"]}:{image["tag"] or yaml.safe_load(open(f"{chart}/Chart.yaml"))["appVersion"]}')
PY
}

hash_files() { # hash_files PATH... : a digest of the files' names and contents
  (cd "$ROOT" && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 \
    | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}

# Builds arguments: machines behind a TLS-inspecting proxy need their CA bundle
# and pip configuration inside RUN steps, or pip cannot reach PyPI.
build_volumes=()
[[ -f /etc/ssl/certs/ca-certificates.crt ]] && build_volumes+=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
[[ -f /etc/pip.conf ]] && build_volumes+=(-v /etc/pip.conf:/etc/pip.conf:ro)

# archive NAME HASH -> path of the cached archive
archive() { echo "$OUT/$1-$2.tar"; }

# ensure_local REF ARCHIVE: the image is in buildah's storage (a FROM finds it).
ensure_local() {
  buildah inspect --type image "$1" >/dev/null 2>&1 || buildah pull -q "oci-archive:$2" >/dev/null
}

# finish NAME HASH REF: export the built image and record it as current.
finish() {
  local tar
  tar="$(archive "$1" "$2")"
  # A temporary name of this process's own: two set-ups on one machine may export the same image at once.
  buildah push -q "$3" "oci-archive:$tar.$$.tmp:$3" >/dev/null
  mv "$tar.$$.tmp" "$tar"
  echo "$tar $3" >"$CURRENT/$1.current"
  log "$1: $3 ($(du -h "$tar" | cut -f1))"
}

cached() { # cached NAME HASH REF: true (and current) when the archive exists
  local tar
  tar="$(archive "$1" "$2")"
  [[ -f "$tar" ]] || return 1
  echo "$tar $3" >"$CURRENT/$1.current"
}

python_hash() { echo "$RECIPE $PYTHON_PACKAGES bookworm" | sha256sum | cut -c1-16; }

build_python() {
  local h
  h="$(python_hash)"
  cached python "$h" "$PYTHON_REF" && return 0
  log "python: Debian bookworm root filesystem with $PYTHON_PACKAGES (first time only; about a minute)"
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  mmdebstrap --quiet --variant=minbase --include="$PYTHON_PACKAGES" bookworm "$work/rootfs.tar" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  local ctr
  ctr="$(buildah from scratch)"
  buildah add -q "$ctr" "$work/rootfs.tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 "$ctr"
  buildah commit -q --rm "$ctr" "$PYTHON_REF" >/dev/null
  finish python "$h" "$PYTHON_REF"
}

build_pause() {
  local h ref
  h="$(echo "$RECIPE" "$(hash_files hack/pause)" | sha256sum | cut -c1-16)"
  ref="localhost/durable-run/pause:$h"
  cached pause "$h" "$ref" && return 0
  log "pause: the pod sandbox image"
  local work ctr
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  (cd "$ROOT/hack/pause" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS= go build -trimpath -ldflags "-s -w" -o "$work/pause" .)
  ctr="$(buildah from scratch)"
  buildah copy -q "$ctr" "$work/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$ctr"
  buildah commit -q --rm "$ctr" "$ref" >/dev/null
  finish pause "$h" "$ref"
}

# The build context: what the Dockerfile's .dockerignore lets in (its `!path`
# lines), staged on its own so that nothing else of a working tree (a venv,
# caches) reaches the build.
context_paths() { sed -n 's#^!\(.*[^/]\)/*$#\1#p' "$ROOT/deploy/images/$1.Dockerfile.dockerignore"; }

build_project_image() { # build_project_image runner|operator
  local name="$1" h ref dockerfile paths
  dockerfile="deploy/images/$name.Dockerfile"
  mapfile -t paths < <(context_paths "$name")
  build_python
  h="$(echo "$RECIPE" "$(python_hash)" "$(hash_files "$dockerfile" "$dockerfile.dockerignore" "${paths[@]}")" | sha256sum | cut -c1-16)"
  ref="$(chart_image "$name")"
  cached "$name" "$h" "$ref" && return 0
  log "$name: buildah build -f $dockerfile (first time for these sources; a minute or two)"
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  (cd "$ROOT" && tar --exclude=__pycache__ --exclude='*.pyc' --exclude='*.egg-info' -cf - "${paths[@]}") \
    | tar -xf - -C "$work"
  ensure_local "$PYTHON_REF" "$(archive python "$(python_hash)")"
  buildah build --quiet --pull=never --network=host --format=oci "${build_volumes[@]}" \
    --build-arg "PYTHON_IMAGE=$PYTHON_REF" -f "$ROOT/$dockerfile" -t "$ref" "$work" >/dev/null
  finish "$name" "$h" "$ref"
}

runner_ref() { cut -d' ' -f2 "$CURRENT/runner.current"; }

# build_workflow NAME DIR REF: FROM the runner image, with DIR's contents in
# /app (on the image's PYTHONPATH), as docs/install.md shows: DIR is the folder
# you would put on PYTHONPATH to run the workflow locally; its requirements.txt,
# if any, is pip-installed into the image.
build_workflow() {
  local name="$1" dir="$2" ref="$3" h
  build_project_image runner
  dir="$(cd "$dir" && pwd)"
  h="$(echo "$RECIPE" "$(runner_ref)" "$(cut -d' ' -f1 "$CURRENT/runner.current")" \
    "$(cd "$dir" && find . -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z \
       | xargs -0 sha256sum | sha256sum)" | sha256sum | cut -c1-16)"
  [[ -n "$ref" ]] || ref="localhost/durable-run/$name:$h"
  cached "$name" "$h" "$ref" && return 0
  log "$name: workflow image FROM $(runner_ref) with $dir in /app"
  local work
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' RETURN
  mkdir "$work/app"
  (cd "$dir" && tar --exclude=__pycache__ --exclude='*.pyc' -cf - .) | tar -xf - -C "$work/app"
  {
    printf 'FROM %s\nCOPY --chown=65532:65532 app/ /app/\n' "$(runner_ref)"
    # DIR/requirements.txt: the workflows' own packages, into the image's venv (root's), as docs/install.md
    # shows; pip reads it in /app, so its -c/-r lines may name other files of DIR.
    if [[ -f "$work/app/requirements.txt" ]]; then
      printf 'USER root\nRUN pip install --no-cache-dir -r /app/requirements.txt\nUSER 65532:65532\n'
    fi
  } >"$work/Containerfile"
  ensure_local "$(runner_ref)" "$(cut -d' ' -f1 "$CURRENT/runner.current")"
  buildah build --quiet --pull=never --network=host --format=oci "${build_volumes[@]}" \
    -f "$work/Containerfile" -t "$ref" "$work" >/dev/null
  finish "$name" "$h" "$ref"
}

if [[ "${1:-}" == workflow ]]; then
  [[ $# -ge 2 ]] || { log "usage: $0 workflow DIR [REF]"; exit 2; }
  name="workflow-$(basename "$(cd "$2" && pwd)" | tr '_A-Z' '-a-z')"
  build_workflow "$name" "$2" "${3:-}"
  cut -d' ' -f2 "$CURRENT/$name.current"
  exit 0
fi

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(python pause runner operator examples)
for t in "${targets[@]}"; do
  case "$t" in
    python) build_python ;;
    pause) build_pause ;;
    runner|operator) build_project_image "$t" ;;
    examples) build_workflow examples "$ROOT/examples" "" ;;
    *) log "unknown image '$t' (expected python, pause, runner, operator or examples)"; exit 2 ;;
  esac
done
