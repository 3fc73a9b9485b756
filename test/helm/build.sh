#!/usr/bin/env bash
# What the chart's and the release workflow's tests run, from Go modules
# (the Go module proxy is the only registry reached), cached in $PIER_CACHE_DIR (scripts/cache-env.sh):
#
#   helm             helm.sh/helm/v4/cmd/helm@$HELM_VERSION         -> $PIER_CACHE_DIR/helm/<version>/helm
#   helm3            helm.sh/helm/v3/cmd/helm@$HELM3_VERSION        -> $PIER_CACHE_DIR/helm3/<version>/helm
#   actionlint       github.com/rhysd/actionlint/cmd/actionlint@... -> $PIER_CACHE_DIR/actionlint/<version>/actionlint
#   prometheus-crds  the ServiceMonitor and PodMonitor CRDs of the module
#                    github.com/prometheus-operator/prometheus-operator@...
#                    (example/prometheus-operator-crd/)             -> $PIER_CACHE_DIR/prometheus-operator/<version>/
#
# Usage: build.sh [helm|helm3|actionlint|prometheus-crds]...   (default: helm)
# Prints, per argument, the binary's path (the folder's for the CRDs) on
# stdout; progress goes to stderr. A folder holds a `recipe` file, a hash of
# this script: a warm run costs a few milliseconds, a changed recipe rebuilds.
#
# Why helm v4 (v4.3.1) rather than v3.22.0: v4 is Helm's current major
# version (v3 gets fixes only), and v4.3.1 builds on k8s.io/client-go
# v0.37.1, the same Kubernetes v1.37.1 modules test/cluster/build.sh builds,
# so most of those packages come from Go's build cache. The chart is
# apiVersion v2, which both read (deploy/helm/README.md); helm3 is built too,
# so that the chart's tests lint and render it with both majors (users still
# run v3), and check that both render the same objects.
# `go install module/cmd@version` builds the module with exactly its own
# go.mod (no replace directives in either) and checks every module it
# downloads against the checksum database, as `go mod download` does.
set -euo pipefail

HELM_VERSION=v4.3.1
# Helm 3, as the Go module proxy here serves it.
HELM3_VERSION=v3.22.0
# The minor of its go.mod's k8s.io/client-go (v0.37.0): Kubernetes 1.37.
HELM3_K8S_MINOR=37
ACTIONLINT_VERSION=v1.7.12
# The newest version of the whole module the proxy serves here (the list of
# versions names v0.85.0 alone; later ones are refused, 403); ServiceMonitor
# and PodMonitor are monitoring.coreos.com/v1 in every version since v0.50.
PROMETHEUS_OPERATOR_VERSION=v0.85.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
exec 3>&1 1>&2
log() { printf '[helm] %s\n' "$*" >&2; }
recipe="$(sha256sum "$here/build.sh" | cut -c1-16)"
source "$root/scripts/cache-env.sh"

go_ready=false
use_go() {
  $go_ready && return 0
  # The machine's Go when new enough, else one fetched (scripts/go-env.sh).
  source "$root/scripts/go-env.sh"
  # Exactly that Go: a module asking for a newer one must fail here, not
  # make the go command download a toolchain of its own.
  export GOTOOLCHAIN=local
  go_ready=true
}

# fresh DIR FILE...: DIR holds every FILE and was made by this recipe.
fresh() {
  local dir="$1" f
  shift
  [[ -f "$dir/recipe" && "$(cat "$dir/recipe")" == "$recipe" ]] || return 1
  for f in "$@"; do [[ -e "$dir/$f" ]] || return 1; done
}

# publish TMP DIR: moves a finished build into place in one step.
publish() {
  local tmp="$1" dir="$2"
  echo "$recipe" >"$tmp/recipe"
  rm -rf "$dir"
  mv -T "$tmp" "$dir"
  # Other versions are dead weight.
  find "$(dirname "$dir")" -mindepth 1 -maxdepth 1 ! -name "$(basename "$dir")" ! -name '.tmp.*' -exec rm -rf {} +
}

# go_install DIR PACKAGE@VERSION LDFLAGS: builds one command into DIR.
go_install() {
  local dir="$1" pkg="$2" ldflags="$3" tmp started=$SECONDS
  mkdir -p "$(dirname "$dir")"
  tmp="$(mktemp -d "$(dirname "$dir")/.tmp.XXXXXX")"
  # Outside any module, so that only the package's own go.mod counts.
  if ! (cd "$tmp" && GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -trimpath -ldflags "$ldflags" "$pkg") >"$tmp/build.log" 2>&1; then
    log "building $pkg failed; the last lines of its log:"
    tail -n 30 "$tmp/build.log" >&2
    rm -rf "$tmp"
    exit 1
  fi
  rm -f "$tmp/build.log"
  publish "$tmp" "$dir"
  log "built $pkg into $dir in $((SECONDS - started)) s"
}

build_helm() {
  local dir="$PIER_CACHE_DIR/helm/$HELM_VERSION"
  if ! fresh "$dir" helm; then
    use_go
    log "building helm $HELM_VERSION (cold: about 6.5 minutes on two cores, module downloads included; seconds with Go's build cache warm)"
    # As Helm's Makefile stamps a release (the commit is not in the module).
    go_install "$dir" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" \
      "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.metadata= -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  fi
  echo "$dir/helm" >&3
}

build_helm3() {
  # Its own folder: publish() removes the other versions beside a build.
  local dir="$PIER_CACHE_DIR/helm3/$HELM3_VERSION"
  if ! fresh "$dir" helm; then
    use_go
    log "building helm $HELM3_VERSION (cold: about 2.5 minutes on two cores, its Kubernetes v1.37.0 modules close to the cluster's; seconds with Go's build cache warm)"
    # As Helm's Makefile stamps a release, the Kubernetes version too: v3 has
    # no default of its own (it says v1.20, which the chart's kubeVersion
    # refuses); Helm's Makefile takes it from go.mod's k8s.io/client-go,
    # v0.37.0 in v3.22.0, so Kubernetes 1.37. (v4 reads it from the build info.)
    local k8s="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$HELM3_K8S_MINOR"
    k8s+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$HELM3_K8S_MINOR"
    go_install "$dir" "helm.sh/helm/v3/cmd/helm@$HELM3_VERSION" \
      "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean $k8s"
  fi
  echo "$dir/helm" >&3
}

build_actionlint() {
  local dir="$PIER_CACHE_DIR/actionlint/$ACTIONLINT_VERSION"
  if ! fresh "$dir" actionlint; then
    use_go
    log "building actionlint $ACTIONLINT_VERSION"
    go_install "$dir" "github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION" \
      "-s -w -X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION"
  fi
  echo "$dir/actionlint" >&3
}

build_prometheus_crds() {
  local dir="$PIER_CACHE_DIR/prometheus-operator/$PROMETHEUS_OPERATOR_VERSION" crd module tmp
  local crds=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_podmonitors.yaml)
  if ! fresh "$dir" "${crds[@]}"; then
    use_go
    log "fetching the prometheus-operator $PROMETHEUS_OPERATOR_VERSION module for its CRDs"
    # The module's zip (about 4 MB), checked against the checksum database.
    module="$(cd /tmp && go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
      sed -n -E 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')"
    [[ -n "$module" && -d "$module/example/prometheus-operator-crd" ]] || { log "no example/prometheus-operator-crd in the module"; exit 1; }
    mkdir -p "$(dirname "$dir")"
    tmp="$(mktemp -d "$(dirname "$dir")/.tmp.XXXXXX")"
    for crd in "${crds[@]}"; do cp "$module/example/prometheus-operator-crd/$crd" "$tmp/$crd"; done
    chmod 0644 "$tmp"/*.yaml
    publish "$tmp" "$dir"
  fi
  echo "$dir" >&3
}

(($# > 0)) || set -- helm
for what in "$@"; do
  pier_cache_lock "$what"
  case "$what" in
    helm) build_helm ;;
    helm3) build_helm3 ;;
    actionlint) build_actionlint ;;
    prometheus-crds) build_prometheus_crds ;;
    *) log "unknown: $what (helm, helm3, actionlint, prometheus-crds)"; exit 2 ;;
  esac
done
