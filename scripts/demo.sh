#!/usr/bin/env bash
# The "run it" command on a fresh Debian machine, as root: installs what the
# demo needs (scripts/setup.sh: Debian packages, Node 24, npm ci, and the
# Kubernetes build: etcd, kube-apiserver, kubectl, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy), then runs the demo (what `npm run
# demo` runs), which builds the images (pier/agent, pier/controller, pause,
# echo) with buildah. Both builds happen on the first run only (6 to 30
# minutes on two cores, progress on stderr); later runs reuse $PIER_CACHE_DIR (~/.cache/pier) and
# start the cluster in about a minute.
# Arguments go to the demo (--exit: stop after the requests).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $(id -u) -ne 0 ]]; then
  echo "demo: needs root (it creates network namespaces and iptables rules); try: sudo $0 $*" >&2
  exit 1
fi
bash "$root/scripts/setup.sh"
source "$root/scripts/node-env.sh"
cd "$root"
# In this script's place, not through npm: npm runs it under `sh -c`, and dash
# does not pass SIGINT on, so a SIGINT to this pid would stop nothing. With
# exec, the pid a user signals (kill -INT, or SIGTERM) is the demo's, which
# then removes everything.
exec node demo/demo.ts "$@"
