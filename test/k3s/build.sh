#!/usr/bin/env bash
# k3s, for test/e2e/k3s.test.ts (the README's k3s quick start, run on a real
# k3s server). Built from its Go module (the Go module proxy is the only
# registry reached), cached in $PIER_CACHE_DIR (scripts/cache-env.sh):
#
#   k3s   github.com/k3s-io/k3s/cmd/server at release $K3S_VERSION
#                                        -> $PIER_CACHE_DIR/k3s/<version>/k3s
#
# cmd/server is the multi-call binary of k3s's own scripts/build: server,
# agent, and kubectl, ctr and crictl when called by those names (the
# downloadable k3s is a wrapper that unpacks it with containerd's shim,
# runc and the CNI plugins; those come from Debian here). Prints the
# binary's path on stdout; progress goes to stderr. The folder holds a
# `recipe` file, a hash of this script: a warm run costs a few
# milliseconds, a changed recipe rebuilds. A cold build took 13 minutes on
# two cores (modules already downloaded), which is why the test never
# starts one on its own (test/e2e/k3s.test.ts skips unless PIER_K3S=build).
set -euo pipefail

# The release, and what the module proxy serves for it: k3s's tags carry
# build metadata (+k3s1), which Go versions cannot, so the proxy answers the
# tag with a pseudo-version of the tag's commit.
K3S_VERSION=v1.30.0+k3s1
K3S_COMMIT=14549535f13c63fc239ba055d36d590e68b01503
K3S_MODULE_VERSION=v1.30.1-0.20240506181825-14549535f13c
# The Go that release's Kubernetes names (build/dependencies.yaml, "golang:
# upstream version"): k3s's scripts/build records it, and k3s refuses to
# start when the Go it was built with is another. The go command fetches
# that toolchain from the module proxy (checked against the checksum
# database) and keeps it in its module cache.
K3S_GO=go1.22.2

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
exec 3>&1 1>&2
log() { printf '[k3s] %s\n' "$*" >&2; }
recipe="$(sha256sum "$here/build.sh" | cut -c1-16)"
source "$root/scripts/cache-env.sh"
dir="$PIER_CACHE_DIR/k3s/$K3S_VERSION"
pier_cache_lock k3s

if [[ -f "$dir/recipe" && "$(cat "$dir/recipe")" == "$recipe" && -x "$dir/k3s" ]]; then
  echo "$dir/k3s" >&3
  exit 0
fi
# The machine's Go (or one fetched by scripts/go-env.sh) runs the go command,
# which switches to $K3S_GO for the build.
source "$root/scripts/go-env.sh"
export GOTOOLCHAIN=$K3S_GO
command -v gcc >/dev/null || { log "gcc is needed (k3s's sqlite datastore is cgo): apt-get install gcc"; exit 1; }

log "building k3s $K3S_VERSION with $K3S_GO (cold: 13 to 25 minutes on two cores, module downloads included; a minute or two with Go's build cache warm)"
started=$SECONDS
mkdir -p "$(dirname "$dir")"
tmp="$(mktemp -d "$(dirname "$dir")/.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# The sum database has no record of the pseudo-version (a 404), so k3s's own
# module alone is taken unchecked; every module it needs is checked against
# k3s's go.sum and the sum database as usual.
export GONOSUMDB=github.com/k3s-io/k3s GOFLAGS=-mod=mod
# go mod download -json reports a refusal on stdout, as an "Error" field.
if ! download="$(cd "$tmp" && go mod download -json "github.com/k3s-io/k3s@$K3S_MODULE_VERSION")"; then
  log "the module proxy did not serve github.com/k3s-io/k3s@$K3S_MODULE_VERSION:"
  printf '%s\n' "$download" | sed -n -E 's/^[[:space:]]*"Error": "(.*)",?$/\1/p' | sed 's/\\n\\t/: /g' >&2
  exit 1
fi
module="$(printf '%s\n' "$download" | sed -n -E 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')"
[[ -n "$module" && -f "$module/go.mod" ]] || { log "go mod download named no folder for github.com/k3s-io/k3s@$K3S_MODULE_VERSION"; exit 1; }

# `go install module@version` refuses a module with replace directives, and
# k3s has dozens (its forks of Kubernetes, containerd, etcd…): build it from
# a module of our own that requires k3s and carries k3s's go.mod (its
# requirements and replacements) and go.sum, so the build list is k3s's.
# One replacement more: inet.af/tcpproxy's vanity host no longer serves it
# (the proxy answers 403); github.com/inetaf/tcpproxy is the same repository.
mkdir "$tmp/mod"
sed -E 's|^module .*|module pier.test/k3s|' "$module/go.mod" >"$tmp/mod/go.mod"
cp "$module/go.sum" "$tmp/mod/go.sum"
chmod 0644 "$tmp/mod/go.mod" "$tmp/mod/go.sum"
cat >>"$tmp/mod/go.mod" <<EOF

require github.com/k3s-io/k3s $K3S_MODULE_VERSION

replace inet.af/tcpproxy => github.com/inetaf/tcpproxy v0.0.0-20200125044825-b6bb9b5b8252
EOF

# k3s's scripts/build flags, less what needs C libraries this machine lacks
# (apparmor, seccomp: only the embedded runc uses them, and Debian's runc
# runs the containers here) and less static linking.
pkg=github.com/k3s-io/k3s
ldflags="-s -w"
ldflags+=" -X $pkg/pkg/version.Version=$K3S_VERSION -X $pkg/pkg/version.GitCommit=${K3S_COMMIT:0:8}"
# As k3s's scripts/build: the upstream Go, which k3s compares with its own at start.
ldflags+=" -X $pkg/pkg/version.UpstreamGolang=$K3S_GO"
for v in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ldflags+=" -X $v.gitVersion=$K3S_VERSION -X $v.gitCommit=$K3S_COMMIT -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
done
tags="ctrd netcgo osusergo providerless urfave_cli_no_docs"

# Counts compiled packages so a person watching a cold build sees it moving;
# the full output is kept for when it fails.
(cd "$tmp/mod" && CGO_ENABLED=1 go build -v -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/k3s" "$pkg/cmd/server") >"$tmp/build.log" 2>&1 &
pid=$! last=0
while kill -0 "$pid" 2>/dev/null; do
  sleep 10
  n=$(wc -l <"$tmp/build.log")
  if (( n / 200 > last / 200 )); then log "$n packages compiled ($((SECONDS - started)) s)"; fi
  last=$n
done
if ! wait "$pid"; then
  log "building k3s failed; the last lines of its log:"
  tail -n 40 "$tmp/build.log" >&2
  exit 1
fi
rm -rf "$tmp/build.log" "$tmp/mod"
chmod 0755 "$tmp"
echo "$recipe" >"$tmp/recipe"
rm -rf "$dir"
mv -T "$tmp" "$dir"
trap - EXIT
# Other versions are dead weight (about 200 MB each).
find "$(dirname "$dir")" -mindepth 1 -maxdepth 1 ! -name "$K3S_VERSION" ! -name '.tmp.*' -exec rm -rf {} +
log "built k3s $K3S_VERSION into $dir in $((SECONDS - started)) s"
echo "$dir/k3s" >&3
