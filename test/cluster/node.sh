#!/usr/bin/env bash
# The two halves of a test node's isolation (node.ts). Run by execa with
# argument arrays; nothing here is built from cluster data.
#
#   node.sh hold CGROUPS NETNS
#     joins the node's cgroups, enters its network namespace and a new mount
#     namespace (slave: the machine's mounts show through, the node's never
#     leak out), gives the node its own /run, /var/log and /var/lib
#     (containerd's shim sockets, pod network namespaces, /run/xtables.lock,
#     /var/log/pods; the kubelet's device-plugin socket, which no flag moves
#     and two kubelets raced for, its serving certificate, the CNI result
#     cache), then waits. Every mount goes away with the namespace's last
#     process, and with it all that the node wrote there.
#
#   node.sh run CGROUPS HOLDER_PID -- COMMAND [ARGS...]
#     joins the node's cgroups and the holder's network and mount namespaces,
#     then execs COMMAND (containerd, kubelet, kube-proxy, ctr...).
#
# CGROUPS is a colon-separated list of cgroup directories (one per
# hierarchy); whatever the node starts is born inside them, containers
# included (the kubelet's cgroupRoot is the same group), so the harness can
# find and kill all of it even after a crash.
set -euo pipefail

join_cgroups() {
  local IFS=:
  for group in $1; do
    echo $$ >"$group/cgroup.procs"
  done
}

case "${1:-}" in
  hold)
    join_cgroups "$2"
    exec nsenter --net="/run/netns/$3" -- unshare --mount --propagation slave -- "$0" hold-inside
    ;;
  hold-inside)
    mount -t tmpfs -o mode=755 pier-node-run /run
    mount -t tmpfs -o mode=755 pier-node-log /var/log
    mount -t tmpfs -o mode=755 pier-node-lib /var/lib
    echo ready
    exec sleep infinity
    ;;
  run)
    join_cgroups "$2"
    holder="$3"
    shift 3
    [[ "${1:-}" == "--" ]] && shift
    exec nsenter --target "$holder" --net --mount -- "$@"
    ;;
  *)
    echo "usage: node.sh hold CGROUPS NETNS | node.sh run CGROUPS HOLDER_PID -- COMMAND..." >&2
    exit 2
    ;;
esac
