#!/usr/bin/env bash
# Builds what running Kubernetes' own e2e specs against pier needs, from the
# k8s.io/kubernetes version test/cluster/build pins:
#
#   e2e.test   `go test -c k8s.io/kubernetes/test/e2e` (the whole upstream suite)
#   agnhost    k8s.io/kubernetes/test/images/agnhost (in the kubernetes module itself)
#   coredns    github.com/coredns/coredns at $COREDNS_VERSION (a module of its own)
#
# into $PIER_CACHE_DIR/upstream/bin/<stamp>/, and two images, made with buildah in a
# private storage ($PIER_CACHE_DIR/upstream/images/storage) since no registry is reachable:
#
#   registry.k8s.io/e2e-test-images/agnhost:<manifest version>   bookworm (mmdebstrap) with
#        the tools upstream's alpine image has (curl, nc, dig, ip/ss, socat, bash) + agnhost
#   registry.k8s.io/coredns/coredns:<version>                    scratch + the static coredns
#
# as docker-archives ($PIER_CACHE_DIR/upstream/images/{agnhost,coredns}.tar) for
# `ctr -n k8s.io images import`. The binaries' stamp hashes test/upstream/build
# (go.mod, go.sum, tools.go), the CoreDNS version and this script; an image's key
# hashes its binary and its recipe. A warm run costs seconds. Prints a JSON
# manifest's path on stdout; progress goes to stderr.
#
# Why a module of its own (test/upstream/build) rather than test/cluster/build:
# the suite's imports (ginkgo, gomega, test fixtures) add requirements to the
# module that builds them, and test/cluster/build.sh's stamp hashes that
# module's go.mod and go.sum, so sharing it would rebuild every cluster binary.
# This module has the same k8s.io/kubernetes require and the same replaces;
# build flags match build.sh's (CGO_ENABLED=0, -trimpath), so the packages
# both compile come from Go's build cache.
set -euo pipefail

COREDNS_VERSION=v1.15.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
mod="$here/build"
exec 3>&1 1>&2
log() { printf '[upstream] %s\n' "$*" >&2; }
indent() { sed -u 's/^/[upstream]   /' >&2; }
die() { log "error: $*"; exit 1; }

source "$root/scripts/cache-env.sh"
cache="$PIER_CACHE_DIR/upstream"
mkdir -p "$cache"
pier_cache_lock upstream

# The machine's Go when new enough, else one fetched (scripts/go-env.sh).
source "$root/scripts/go-env.sh"

stamp="$(cat "$mod/go.mod" "$mod/go.sum" "$mod/tools.go" "$here/build.sh" | sha256sum | cut -c1-16)"
bin="$cache/bin/$stamp"

# --- binaries -------------------------------------------------------------------

k8s_dir="$(cd "$mod" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
k8s_version="$(cd "$mod" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
agnhost_version="$(sed -n 's/.*configs\[Agnhost\] = Config{list.PromoterE2eRegistry, "agnhost", "\([^"]*\)"}.*/\1/p' "$k8s_dir/test/utils/image/manifest.go")"
[[ -n "$agnhost_version" ]] || die "no agnhost version in $k8s_dir/test/utils/image/manifest.go"
AGNHOST="registry.k8s.io/e2e-test-images/agnhost:$agnhost_version"
COREDNS="registry.k8s.io/coredns/coredns:$COREDNS_VERSION"

ver_pkg="k8s.io/component-base/version"
ldflags="-s -w -X $ver_pkg.gitVersion=$k8s_version -X $ver_pkg.gitTreeState=clean -X $ver_pkg.buildDate=1970-01-01T00:00:00Z"
ldflags+=" -X $ver_pkg.gitMajor=$(echo "$k8s_version" | sed -E 's/^v([0-9]+)\..*/\1/')"
ldflags+=" -X $ver_pkg.gitMinor=$(echo "$k8s_version" | sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/')"

# Runs a build in the background, printing a line every minute so that a cold
# build (tens of minutes on two cores) visibly moves; the log is shown on failure.
run_build() {
  local what="$1" log="$2"; shift 2
  local started=$SECONDS
  "$@" >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    if (( (SECONDS - started) % 60 < 5 && SECONDS - started >= 60 )); then log "$what: still building ($((SECONDS - started)) s)"; fi
  done
  if ! wait "$pid"; then
    log "building $what failed; last lines:"
    tail -n 40 "$log" | indent
    exit 1
  fi
  log "$what: built in $((SECONDS - started)) s"
}

if [[ -x "$bin/e2e.test" && -x "$bin/agnhost" && -x "$bin/coredns" ]]; then
  log "binaries: $bin is up to date"
else
  tmp="$bin.tmp.$$"
  mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  log "building e2e.test and agnhost ($k8s_version) and coredns $COREDNS_VERSION into $bin (cold: 15 to 40 minutes on two cores)"
  run_build agnhost "$tmp/agnhost.log" env -C "$mod" CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost
  # Outside any module: coredns@version with its own go.mod (it has no replaces).
  run_build coredns "$tmp/coredns.log" env -C "$tmp" GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
  run_build e2e.test "$tmp/e2e.log" env -C "$mod" CGO_ENABLED=0 go test -c -vet=off -trimpath -ldflags "$ldflags" -o "$tmp/e2e.test" k8s.io/kubernetes/test/e2e
  rm -f "$tmp"/*.log
  rm -rf "$bin"
  mv "$tmp" "$bin"
  trap - EXIT
  # Builds for other pins are dead weight.
  find "$cache/bin" -mindepth 1 -maxdepth 1 ! -name "$stamp" -exec rm -rf {} +
fi

# --- images ---------------------------------------------------------------------

out="$cache/images"
storage="$out/storage"
runroot="$out/run"
mkdir -p "$out/keys"
if [[ -f "$out/driver" ]]; then
  driver="$(cat "$out/driver")"
else
  # The driver test/images/build.sh found usable here.
  driver="$(cat "$PIER_CACHE_DIR/images/driver" 2>/dev/null || echo vfs)"
  echo "$driver" >"$out/driver"
fi
work="$(mktemp -d "$out/work.XXXXXX")"
trap 'rm -rf "$work"' EXIT
source "$root/test/images/store.sh"

# Upstream's image is alpine (busybox: wget, used by the source-range spec) + apk add bind-tools curl netcat-openbsd iproute2
# iperf bash util-linux-misc socat; here the same tools from bookworm, which
# this machine's apt sources serve. wget is GNU wget told to try once
# (/etc/wgetrc), as busybox's does: by default it tries a timed-out
# connection 20 times, so the source-range spec's `wget -T 5` against a
# dropped port took minutes instead of 5 s; bookworm's busybox wget crashes
# on -T (segfault, 1.35.0). The rest as upstream's Dockerfile lays it
# out: /agnhost (+ agnhost-2), /uploads, porter's certificate, the user and
# group one spec expects, ENTRYPOINT /agnhost, CMD pause.
build_agnhost() {
  local agnhost="$1" src="$2" c
  cp "$agnhost" "$work/agnhost"
  mmdebstrap --variant=minbase --format=tar --quiet \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --include=curl,wget,netcat-openbsd,iproute2,bind9-dnsutils,iputils-ping,bash,socat,iperf,util-linux,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -f "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/*_Packages*' \
    --customize-hook="cp '$work/agnhost' \"\$1/agnhost\"" \
    --customize-hook='ln -s agnhost "$1/agnhost-2"' \
    --customize-hook='echo "tries = 1" >>"$1/etc/wgetrc"' \
    --customize-hook='mkdir -p "$1/uploads"' \
    --customize-hook="cp '$src/porter/localhost.crt' '$src/porter/localhost.key' \"\$1/\"" \
    --customize-hook='chroot "$1" groupadd -g 50000 group-defined-in-image' \
    --customize-hook='chroot "$1" useradd -u 1000 -G group-defined-in-image user-defined-in-image' \
    bookworm - /etc/apt/sources.list.d/debian.sources 2> >(indent) |
    tar --delete -f - --wildcards './dev/*' >"$work/agnhost-rootfs.tar"
  c="$(bh from --quiet scratch)"
  bh add --quiet "$c" "$work/agnhost-rootfs.tar" /
  bh config --os linux --arch amd64 --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --port 80 --port 8080 --port 8081 --port 9376 --port 5000 \
    --entrypoint '["/agnhost"]' --cmd '["pause"]' "$c"
  bh commit --quiet --rm "$c" "$AGNHOST" >/dev/null
}

# As the official image: the static binary alone (theirs adds distroless's
# CA bundle and passwd), ENTRYPOINT /coredns, port 53.
build_coredns() {
  local coredns="$1" c
  c="$(bh from --quiet scratch)"
  bh copy --quiet --chmod 0755 "$c" "$coredns" /coredns
  bh config --os linux --arch amd64 --port 53/udp --port 53/tcp --entrypoint '["/coredns"]' "$c"
  bh commit --quiet --rm "$c" "$COREDNS" >/dev/null
}

agnhost_key="$(printf '%s\n' "$AGNHOST" "$(sha <"$bin/agnhost")" "$(recipe build_agnhost)" "$(sha </etc/apt/sources.list.d/debian.sources)" | sha)"
if fresh agnhost "$AGNHOST" "$agnhost_key"; then
  log "agnhost: $AGNHOST is up to date"
else
  started=$SECONDS
  build_agnhost "$bin/agnhost" "$k8s_dir/test/images/agnhost"
  export_archive agnhost "$AGNHOST" "$agnhost_key"
  log "agnhost: built $AGNHOST in $((SECONDS - started)) s"
fi
coredns_key="$(printf '%s\n' "$COREDNS" "$(sha <"$bin/coredns")" "$(recipe build_coredns)" | sha)"
if fresh coredns "$COREDNS" "$coredns_key"; then
  log "coredns: $COREDNS is up to date"
else
  build_coredns "$bin/coredns"
  export_archive coredns "$COREDNS" "$coredns_key"
  log "coredns: built $COREDNS"
fi
# Images no longer named (an older agnhost or coredns) are dead weight.
bh rmi --prune >/dev/null 2>&1 || true

cat >"$cache/upstream.json" <<EOF
{
  "e2eTest": "$bin/e2e.test",
  "kubernetesVersion": "$k8s_version",
  "kubernetesDir": "$k8s_dir",
  "images": {
    "agnhost": { "name": "$AGNHOST", "archive": "$out/agnhost.tar" },
    "coredns": { "name": "$COREDNS", "archive": "$out/coredns.tar" }
  }
}
EOF
echo "$cache/upstream.json" >&3
