# Sourced, not run: PIER_CACHE_DIR, the machine-wide cache of everything the
# tests build (Node, Go, Kubernetes, images, helm, the upstream specs, kwok,
# k3s), shared by every clone on the machine so that a fresh clone rebuilds
# nothing an earlier run built. Each entry is keyed by a hash of its recipe
# and moved into place whole, so a half-built one is never used; builds of
# one entry take turns under pier_cache_lock.
# ${XDG_CACHE_HOME:-~/.cache}/pier unless PIER_CACHE_DIR says otherwise.
export PIER_CACHE_DIR="${PIER_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/pier}"
mkdir -p "$PIER_CACHE_DIR"

# pier_cache_lock NAME: waits for, then holds until this shell exits, the
# lock of cache entry NAME, so that two clones building it at once take turns.
pier_cache_lock() {
  local fd
  exec {fd}>"$PIER_CACHE_DIR/.$1.lock"
  if ! flock -n "$fd"; then
    echo "[cache] waiting for another build of $1 in $PIER_CACHE_DIR" >&2
    flock "$fd"
  fi
}
