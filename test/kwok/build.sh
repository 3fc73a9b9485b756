#!/usr/bin/env bash
# kwok, the Kubernetes SIG's node simulator, for bench/scale.ts: it keeps
# thousands of fake Nodes Ready and their node Leases renewed against the
# project's own kube-apiserver (test/cluster/). Built from its Go module (the
# Go module proxy is the only registry reached), cached in $PIER_CACHE_DIR (scripts/cache-env.sh):
#
#   kwok    sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION -> $PIER_CACHE_DIR/kwok/<version>/kwok
#   stages  the module's own node Stages, which kwokctl gives kwok when node
#           Leases are on (kustomize/stage/node/fast/node-initialize.yaml,
#           kustomize/stage/node/heartbeat-with-lease/...yaml)
#                                                   -> $PIER_CACHE_DIR/kwok/<version>/stages/
#
# Only kwok: kwokctl (which starts clusters of its own) is not needed, and
# kwok alone starts with no Stage: bench/scale.ts passes these with --config.
# Prints the binary's path on stdout (the stages sit beside it); progress goes to stderr. The folder
# holds a `recipe` file, a hash of this script: a warm run costs a few
# milliseconds, a changed recipe rebuilds.
# `go install module/cmd@version` builds the module with exactly its own
# go.mod and checks every module it downloads against the checksum database.
# v0.8.0 asks for go 1.26.0, which scripts/go-env.sh provides.
set -euo pipefail

KWOK_VERSION=v0.8.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
exec 3>&1 1>&2
log() { printf '[kwok] %s\n' "$*" >&2; }
recipe="$(sha256sum "$here/build.sh" | cut -c1-16)"
source "$root/scripts/cache-env.sh"
dir="$PIER_CACHE_DIR/kwok/$KWOK_VERSION"
pier_cache_lock kwok

stages=(node-initialize.yaml node-heartbeat-with-lease.yaml)
if [[ -f "$dir/recipe" && "$(cat "$dir/recipe")" == "$recipe" && -x "$dir/kwok" && -f "$dir/stages/${stages[0]}" && -f "$dir/stages/${stages[1]}" ]]; then
  echo "$dir/kwok" >&3
  exit 0
fi

# The machine's Go when new enough, else one fetched (scripts/go-env.sh).
source "$root/scripts/go-env.sh"
# Exactly that Go: a module asking for a newer one must fail here, not make
# the go command download a toolchain of its own.
export GOTOOLCHAIN=local

log "building kwok $KWOK_VERSION (cold: a few minutes on two cores, module downloads included; seconds with Go's build cache warm)"
started=$SECONDS
mkdir -p "$(dirname "$dir")"
tmp="$(mktemp -d "$(dirname "$dir")/.tmp.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# Outside any module, so that only kwok's own go.mod counts (its
# pkg/consts already names the release).
if ! (cd "$tmp" && GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -trimpath -ldflags "-s -w" \
  "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION") >"$tmp/build.log" 2>&1; then
  log "building kwok failed; the last lines of its log:"
  tail -n 30 "$tmp/build.log" >&2
  exit 1
fi
rm -f "$tmp/build.log"
# The module is in Go's module cache now: this only names its folder.
module="$(cd "$tmp" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n -E 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')"
chmod 0755 "$tmp"
mkdir "$tmp/stages"
cp "$module/kustomize/stage/node/fast/node-initialize.yaml" "$module/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" "$tmp/stages/"
chmod 0644 "$tmp"/stages/*.yaml
echo "$recipe" >"$tmp/recipe"
rm -rf "$dir"
mv -T "$tmp" "$dir"
trap - EXIT
# Other versions are dead weight.
find "$(dirname "$dir")" -mindepth 1 -maxdepth 1 ! -name "$KWOK_VERSION" ! -name '.tmp.*' -exec rm -rf {} +
log "built kwok $KWOK_VERSION into $dir in $((SECONDS - started)) s"
echo "$dir/kwok" >&3
