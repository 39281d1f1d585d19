#!/usr/bin/env bash
# Builds the test bed's Go binaries once from their published Go modules and
# caches them outside the repo, keyed by version:
#   $DURABLERUN_CACHE/bin/<name>-<version>
# A binary already in the cache is not rebuilt. The kubelet and kube-scheduler
# are the real node's (hack/durablerun_testbed/realnode.py). Users with envtest binaries
# (KUBEBUILDER_ASSETS or TEST_ASSET_KUBE_APISERVER / TEST_ASSET_ETCD) skip the
# control-plane build.
#
# Usage: hack/build-binaries.sh [kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|etcd|minio|helm|
#                                kubeconform|prometheus-operator-crds|jaeger|kueue ...]
# (default: what the sandbox runs, keeping a cold `make demo` short: `make lint` builds kubeconform and the
# Prometheus Operator's CRDs, `make test` Jaeger and Kueue)
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
CACHE="${DURABLERUN_CACHE:-$HOME/.cache/durable-run}"
BIN="$CACHE/bin"
SRC="$CACHE/src"
mkdir -p "$BIN" "$SRC"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local

log() { printf '[build-binaries] %s\n' "$*" >&2; }

# A fresh wrapper module in $SRC/<dir>; prints its path.
wrapper_module() {
  local dir="$SRC/$1"
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$dir" && go mod init "durablerun.local/build/$1" >/dev/null 2>&1)
  echo "$dir"
}

# build_kubernetes <component>: kube-apiserver, kube-controller-manager, kube-scheduler or kubelet.
build_kubernetes() {
  local component="$1"
  local out="$BIN/$component-$KUBERNETES_VERSION"
  [[ -x "$out" ]] && return 0
  log "building $component $KUBERNETES_VERSION (first time only; several minutes)"
  local dir minor staging
  dir="$(wrapper_module "$component-$KUBERNETES_VERSION")"
  minor="$(cut -d. -f2 <<<"$KUBERNETES_VERSION")"
  cd "$dir"
  # k8s.io/kubernetes replaces every staging module with ./staging/...; a
  # wrapper replaces each with its published v0.<minor>.<patch> instead. The
  # list comes from that release's own go.mod, so it tracks the release.
  local gomod
  gomod="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  staging="$(grep -oE '^\s*(k8s\.io/[a-z0-9-]+) => \./staging/' "$gomod" | awk '{print $1}')"
  go mod edit -require "k8s.io/kubernetes@$KUBERNETES_VERSION"
  local staged_version="v0.${KUBERNETES_VERSION#v1.}"
  for m in $staging; do
    go mod edit -replace "$m=$m@$staged_version"
  done
  printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/%s/app"\n' "$component" >tools.go
  go mod tidy >/dev/null
  local ldflags=(
    "-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
    "-X k8s.io/component-base/version.gitMajor=1"
    "-X k8s.io/component-base/version.gitMinor=$minor"
    "-X k8s.io/component-base/version.gitTreeState=clean"
    "-X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
    "-X k8s.io/client-go/pkg/version.gitMajor=1"
    "-X k8s.io/client-go/pkg/version.gitMinor=$minor"
  )
  go build -trimpath -ldflags "-s -w ${ldflags[*]}" -o "$out.tmp" "k8s.io/kubernetes/cmd/$component"
  mv "$out.tmp" "$out"
}

build_etcd() {
  local out="$BIN/etcd-$ETCD_VERSION"
  [[ -x "$out" ]] && return 0
  log "building etcd $ETCD_VERSION"
  local dir
  dir="$(wrapper_module "etcd-$ETCD_VERSION")"
  cd "$dir"
  # etcd's own go.mod has relative replaces, so `go install` refuses it; as a
  # dependency of a wrapper those replaces are ignored.
  go mod edit -require "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3/etcdmain"\n' >tools.go
  go mod tidy >/dev/null
  go build -trimpath -ldflags "-s -w" -o "$out.tmp" go.etcd.io/etcd/server/v3
  mv "$out.tmp" "$out"
}

# go_install OUT PACKAGE@VERSION [LDFLAGS]: `go install` a module's command
# (module mode, ignoring any GOFLAGS) and move the binary to OUT.
go_install() {
  local out="$1" package="$2" ldflags="${3:-}"
  local gobin="$SRC/$(basename "$out")" command="${2%@*}"
  mkdir -p "$gobin"
  GOBIN="$gobin" GOFLAGS= go install -trimpath -ldflags "-s -w $ldflags" "$package"
  mv "$gobin/${command##*/}" "$out"
}

build_minio() {
  local out="$BIN/minio-$MINIO_VERSION"
  [[ -x "$out" ]] && return 0
  log "building minio $MINIO_VERSION (first time only; several minutes)"
  go_install "$out" "github.com/minio/minio@$MINIO_VERSION"
}

build_helm() {
  local out="$BIN/helm-$HELM_VERSION"
  [[ -x "$out" ]] && return 0
  log "building helm $HELM_VERSION"
  go_install "$out" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
}

build_kubeconform() {
  local out="$BIN/kubeconform-$KUBECONFORM_VERSION"
  [[ -x "$out" ]] && return 0
  log "building kubeconform $KUBECONFORM_VERSION"
  go_install "$out" "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
}

# The Prometheus Operator's CRDs (ServiceMonitor, PrometheusRule, ...) for
# kubeconform: controller-gen, built from its module, generates them from the
# Go types of github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring.
build_prometheus_operator_crds() {
  local out="$CACHE/crds/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
  [[ -f "$out/monitoring.coreos.com_servicemonitors.yaml" ]] && return 0
  log "generating the Prometheus Operator CRDs $PROMETHEUS_OPERATOR_VERSION (controller-gen $CONTROLLER_TOOLS_VERSION)"
  local gen="$BIN/controller-gen-$CONTROLLER_TOOLS_VERSION"
  [[ -x "$gen" ]] || go_install "$gen" "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION"
  local dir module=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
  dir="$(wrapper_module "prometheus-operator-crds-$PROMETHEUS_OPERATOR_VERSION")"
  cd "$dir"
  go mod edit -require "$module@$PROMETHEUS_OPERATOR_VERSION"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s/v1"\n' "$module" >tools.go
  go mod tidy >/dev/null
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  "$gen" crd:crdVersions=v1,maxDescLen=0 paths="$module/v1" output:crd:dir="$out.tmp" >/dev/null
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# Jaeger v2 (cmd/jaeger, an OpenTelemetry Collector distribution) for the tracing tests. Its go.mod has a
# replace directive, so `go install` refuses it: build it from a wrapper module carrying the same replaces.
build_jaeger() {
  local out="$BIN/jaeger-$JAEGER_VERSION"
  [[ -x "$out" ]] && return 0
  log "building jaeger $JAEGER_VERSION (first time only; a few minutes)"
  local dir module=github.com/jaegertracing/jaeger gomod
  dir="$(wrapper_module "jaeger-$JAEGER_VERSION")"
  cd "$dir"
  go mod edit -require "$module@$JAEGER_VERSION"
  gomod="$(go mod download -json "$module@$JAEGER_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  grep -E '^replace [^ ]+ => [^ .][^ ]* v' "$gomod" | while read -r _ from _ to version; do
    go mod edit -replace "$from=$to@$version"
  done
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd/jaeger"\n' "$module" >tools.go
  go mod tidy >/dev/null
  go build -trimpath -ldflags "-s -w -X $module/internal/version.latestVersion=$JAEGER_VERSION" -o "$out.tmp" \
    "$module/cmd/jaeger"
  mv "$out.tmp" "$out"
}

# The Kueue manager (cmd/kueue). Its go.mod has no replace directives, so a plain `go install` builds it
# (with -mod=mod, as exported above). Long: over half an hour on a loaded two-core machine the first time; a
# change of ldflags alone only links again. The visibility server writes its self-signed certificates to the
# package variable certDir, "/visibility" by default: a relative "visibility" puts them in the working
# directory of each manager (hack/durablerun_testbed/kueue.py runs each in its bed's own).
build_kueue() {
  local out="$BIN/kueue-$KUEUE_BUILD"
  [[ -x "$out" ]] && return 0
  log "building kueue $KUEUE_BUILD (first time only; 15-60 minutes)"
  local gobin="$SRC/kueue-$KUEUE_BUILD"
  mkdir -p "$gobin"
  GOBIN="$gobin" go install -ldflags "-X sigs.k8s.io/kueue/pkg/visibility.certDir=visibility" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  mv "$gobin/kueue" "$out"
}

targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(kube-apiserver kube-controller-manager kube-scheduler kubelet etcd minio helm)
for t in "${targets[@]}"; do
  began=$SECONDS
  case "$t" in
    kube-apiserver)
      if [[ -n "${KUBEBUILDER_ASSETS:-}${TEST_ASSET_KUBE_APISERVER:-}" ]]; then log "kube-apiserver from envtest assets"; else (build_kubernetes kube-apiserver); fi ;;
    kube-controller-manager)
      if [[ -n "${KUBEBUILDER_ASSETS:-}${TEST_ASSET_KUBE_CONTROLLER_MANAGER:-}" ]]; then log "kube-controller-manager from envtest assets"; else (build_kubernetes kube-controller-manager); fi ;;
    kube-scheduler)
      if [[ -n "${KUBEBUILDER_ASSETS:-}${TEST_ASSET_KUBE_SCHEDULER:-}" ]]; then log "kube-scheduler from envtest assets"; else (build_kubernetes kube-scheduler); fi ;;
    kubelet) (build_kubernetes kubelet) ;;
    etcd)
      if [[ -n "${KUBEBUILDER_ASSETS:-}${TEST_ASSET_ETCD:-}" ]]; then log "etcd from envtest assets"; else (build_etcd); fi ;;
    minio) (build_minio) ;;
    helm) (build_helm) ;;
    kubeconform) (build_kubeconform) ;;
    prometheus-operator-crds) (build_prometheus_operator_crds) ;;
    jaeger) (build_jaeger) ;;
    kueue) (build_kueue) ;;
    *) log "unknown binary '$t' (expected kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, etcd, minio, helm, kubeconform, prometheus-operator-crds, jaeger or kueue)"; exit 2 ;;
  esac
  # Say what a first build cost (a cached binary takes no time and says nothing).
  [[ $((SECONDS - began)) -lt 2 ]] || log "$t: built in $((SECONDS - began))s"
done
