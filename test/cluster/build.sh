#!/usr/bin/env bash
# Builds a whole Kubernetes from Go modules into $PIER_CACHE_DIR/cluster/<stamp>/: etcd,
# kube-apiserver, kubectl, and for the real nodes kube-controller-manager,
# kube-scheduler, kubelet and kube-proxy, all from one k8s.io/kubernetes
# version. kubectl renders deploy/ (its built-in kustomize) and applies it in
# the deploy tests and the demo.
# The stamp hashes the pinned versions (go.mod, go.sum) and this script, so a
# warm cache costs nothing and a version bump rebuilds. Prints the directory
# holding the binaries on stdout; progress goes to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
mod="$here/build"
stamp="$(cat "$mod/go.mod" "$mod/go.sum" "$mod/etcd/main.go" "$here/build.sh" | sha256sum | cut -c1-16)"
source "$root/scripts/cache-env.sh"
out="${PIER_CLUSTER_BIN_DIR:-$PIER_CACHE_DIR/cluster/$stamp}"

k8s_commands=(kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy)
have_all=true
for b in etcd "${k8s_commands[@]}"; do [[ -x "$out/$b" ]] || have_all=false; done
if $have_all; then
  echo "$out"
  exit 0
fi
pier_cache_lock cluster
have_all=true
for b in etcd "${k8s_commands[@]}"; do [[ -x "$out/$b" ]] || have_all=false; done
if $have_all; then
  echo "$out"
  exit 0
fi

# The machine's Go when new enough, else one fetched (scripts/go-env.sh).
source "$root/scripts/go-env.sh"

k8s_version="$(cd "$mod" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
etcd_version="$(cd "$mod" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
tmp="$out.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

# Counts compiled packages so a person watching a cold build (about 7 minutes
# on two cores) sees it moving; the full output is kept for when it fails.
build() {
  local what="$1"; shift
  local log="$tmp/$what.build.log"
  (cd "$mod" && CGO_ENABLED=0 go build -v -trimpath "$@") >"$log" 2>&1 &
  local pid=$! last=0 n
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    n=$(wc -l <"$log")
    if (( n / 100 > last / 100 )); then echo "[cluster] $what: $n packages compiled ($((SECONDS - start))s)" >&2; fi
    last=$n
  done
  if ! wait "$pid"; then
    echo "[cluster] building $what failed; last lines of the go build output:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
}

echo "[cluster] building ${k8s_commands[*]} $k8s_version and etcd $etcd_version into $out (the first build takes 6 to 30 minutes on two cores)" >&2
start=$SECONDS

# kube-apiserver reports the version it was stamped with; client libraries and
# our tests read it back from /version.
ver_pkg="k8s.io/component-base/version"
ldflags="-s -w"
ldflags+=" -X $ver_pkg.gitVersion=$k8s_version"
ldflags+=" -X $ver_pkg.gitMajor=$(echo "$k8s_version" | sed -E 's/^v([0-9]+)\..*/\1/')"
ldflags+=" -X $ver_pkg.gitMinor=$(echo "$k8s_version" | sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/')"
ldflags+=" -X $ver_pkg.gitTreeState=clean"
ldflags+=" -X $ver_pkg.buildDate=1970-01-01T00:00:00Z"

build etcd -ldflags "-s -w" -o "$tmp/etcd" ./etcd
echo "[cluster] etcd built after $((SECONDS - start))s" >&2

for cmd in "${k8s_commands[@]}"; do
  build "$cmd" -ldflags "$ldflags" -o "$tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd"
  echo "[cluster] $cmd built after $((SECONDS - start))s" >&2
done

rm -f "$tmp"/*.build.log
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
# Builds for other pins are dead weight (about 150 MB each).
if [[ -z "${PIER_CLUSTER_BIN_DIR:-}" ]]; then
  find "$PIER_CACHE_DIR/cluster" -mindepth 1 -maxdepth 1 ! -name "$stamp" -exec rm -rf {} +
fi
echo "$out"
