#!/usr/bin/env bash
# Everything pier's tests need on a fresh Debian machine, installed only when
# missing, so a second run costs seconds: the Debian packages the lab uses,
# Node >= 22.19 (Node 24 from npm when the machine's is older), the npm
# dependencies, and the kube-apiserver/etcd builds (with a Go fetched into
# ~/.cache/pier/go when the machine's is missing or too old). Safe to run repeatedly.
# With --runtime, only Node and the npm dependencies (what `pier` itself needs);
# with --no-cluster, all but the Kubernetes build (scripts/test.sh times it apart).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
runtime_only=false cluster=true
[[ "${1:-}" == "--runtime" ]] && runtime_only=true cluster=false
[[ "${1:-}" == "--no-cluster" ]] && cluster=false

# Debian packages: iptables (nft and legacy), iproute2 for namespaces,
# conntrack for inspecting connections, openssl for the test CA, util-linux
# for setpriv and nsenter. Go comes with the machine (/usr/local/go) when new
# enough, else scripts/go-env.sh (sourced by test/cluster/build.sh) fetches it
# into ~/.cache/pier/go with curl and unzip: Debian's golang-go is too old.
need=()
if ! $runtime_only; then
  # The real-node tests add a container runtime and an image builder:
  # containerd, runc and the CNI plugins for the nodes, nft for kube-proxy's
  # nftables mode, buildah and mmdebstrap for the images (base images are
  # built locally: no registry is reachable), gcc and libc6-dev for the pause
  # binary. shellcheck checks the release workflow's scripts (actionlint runs
  # it).
  for pair in iptables:iptables ip6tables:iptables ip:iproute2 conntrack:conntrack openssl:openssl setpriv:util-linux \
    containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins nft:nftables \
    buildah:buildah mmdebstrap:mmdebstrap gcc:gcc /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev \
    curl:curl unzip:unzip shellcheck:shellcheck; do
    cmd="${pair%%:*}" pkg="${pair#*:}"
    if [[ "$cmd" == /* ]]; then [[ -e "$cmd" ]] || need+=("$pkg"); else command -v "$cmd" >/dev/null || need+=("$pkg"); fi
  done
fi
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing Debian packages ${need[*]}; run as root or install them" >&2
    exit 1
  fi
  echo "[setup] installing Debian packages: ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# shellcheck source=node-env.sh
source "$root/scripts/node-env.sh"

# npm ci is the slow part; skip it while the lockfile is unchanged.
stamp="$root/node_modules/.pier-lock-hash"
want="$(sha256sum package-lock.json | cut -c1-64)-$(node --version)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "[setup] npm ci" >&2
  npm ci --no-audit --no-fund --loglevel=error >&2
  echo "$want" >"$stamp"
fi

! $cluster || bash "$root/test/cluster/build.sh" >/dev/null
