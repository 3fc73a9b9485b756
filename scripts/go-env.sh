# Sourced, not run: puts a Go new enough for the pinned Kubernetes modules
# first on PATH. test/cluster/build.sh and test/upstream/build.sh source it, so
# this is the one place that decides which go builds.
# The minimum is the highest `go`/`toolchain` line of test/cluster/build/go.mod
# and test/upstream/build/go.mod. The machine's go (/usr/local/go, then PATH)
# is used when new enough; otherwise (a fresh Debian has none, and bookworm's
# golang-go is 1.19) the official toolchain of exactly that version is fetched
# once from the Go module proxy, which serves it as the module
# golang.org/toolchain, into $PIER_CACHE_DIR/go/<version> (scripts/cache-env.sh).
# For tests: PIER_GO_CACHE_DIR replaces $PIER_CACHE_DIR/go, PIER_MACHINE_GOROOT
# replaces /usr/local/go (empty: none).
pier_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$pier_root/scripts/cache-env.sh"
pier_go_dir="${PIER_GO_CACHE_DIR:-$PIER_CACHE_DIR/go}"
pier_go_machine="${PIER_MACHINE_GOROOT-/usr/local/go}"

# "go 1.26" in a go.mod means the 1.26.0 release at least.
pier_go_want="$(sed -n -E 's/^go ([0-9]+\.[0-9]+(\.[0-9]+)?)[[:space:]]*$/\1/p; s/^toolchain go([0-9]+\.[0-9]+(\.[0-9]+)?)[[:space:]]*$/\1/p' \
  "$pier_root/test/cluster/build/go.mod" "$pier_root/test/upstream/build/go.mod" |
  sed -E 's/^([0-9]+\.[0-9]+)$/\1.0/' | sort -V | tail -n 1)"

# The version of the go first on PATH, "" when none runs. GOTOOLCHAIN=local:
# asking must not make a newer go switch toolchains (a download) on its own.
pier_go_version() {
  GOTOOLCHAIN=local go version 2>/dev/null | sed -n -E 's/^go version go([0-9]+\.[0-9]+(\.[0-9]+)?).*/\1/p'
}
pier_go_ok() {
  local v
  v="$(pier_go_version)"
  [[ -n "$v" && "$(printf '%s\n' "$pier_go_want" "$v" | sort -V | head -n 1)" == "$pier_go_want" ]]
}

# Downloads golang.org/toolchain@v0.0.1-go<version>.linux-<arch> from the
# first GOPROXY entry that has it and unpacks its go/ tree into <dir>.
pier_go_fetch() {
  local version="$1" dest="$2" arch proxies proxy ver tmp sum want got pair url tree
  case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) echo "[go] no Go toolchain is published for $(uname -m)" >&2; return 1 ;;
  esac
  ver="v0.0.1-go$version.linux-$arch"
  local need=()
  for pair in curl:curl unzip:unzip openssl:openssl; do command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}"); done
  if ((${#need[@]})); then
    echo "[go] installing Debian packages ${need[*]} to fetch Go $version" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || return 1
  fi
  # The proxies the go command would ask: GOPROXY, else the machine's old go's
  # setting, else the default; "direct" and "off" name no proxy to fetch from.
  proxies="${GOPROXY:-$(GOTOOLCHAIN=local go env GOPROXY 2>/dev/null || true)}"
  proxies="${proxies:-https://proxy.golang.org}"
  # Called under `||`, where set -e is off: each step checks its own failure.
  mkdir -p "$pier_go_dir" && tmp="$(mktemp -d "$pier_go_dir/.fetch.XXXXXX")" || return 1
  for proxy in ${proxies//[,|]/ }; do
    [[ "$proxy" == direct || "$proxy" == off ]] && continue
    proxy="${proxy%/}"
    echo "[go] fetching Go $version ($ver, about 70 MB) from $proxy into $dest" >&2
    curl -fsSL --retry 2 -o "$tmp/go.zip" "$proxy/golang.org/toolchain/@v/$ver.zip" || continue
    # Verified against the checksum database's record (h1:, the hash the go
    # command checks a module zip against), asked through the same proxy's
    # /sumdb/ endpoint as the go command does, then sum.golang.org itself.
    # The proxy serves both, so this catches a corrupt or substituted zip only
    # as far as the record is trusted: the tree's signature and inclusion
    # proof, which the go command also checks, are not checked here.
    sum=""
    for url in "$proxy/sumdb/sum.golang.org/lookup/golang.org/toolchain@$ver" "https://sum.golang.org/lookup/golang.org/toolchain@$ver"; do
      sum="$(curl -fsS --retry 2 "$url" 2>/dev/null)" && break
    done
    want="$(sed -n "s|^golang.org/toolchain $ver h1:\([A-Za-z0-9+/=]*\)\$|\1|p" <<<"$sum")"
    if [[ -z "$want" ]]; then
      echo "[go] the checksum database has no record of golang.org/toolchain@$ver; not using the download" >&2
      rm -rf "$tmp"; return 1
    fi
    unzip -q "$tmp/go.zip" -d "$tmp/x" || { rm -rf "$tmp"; return 1; }
    # Go's dirhash "h1": SHA-256 over the sorted "<sha256>  <name>" lines of
    # every file in the zip, which is what sha256sum prints.
    got="$(cd "$tmp/x" && find . -type f -printf '%P\n' | LC_ALL=C sort | tr '\n' '\0' |
      xargs -0 sha256sum | openssl dgst -sha256 -binary | base64)"
    if [[ "$got" != "$want" ]]; then
      echo "[go] golang.org/toolchain@$ver from $proxy hashes to h1:$got, the checksum database says h1:$want; not using it" >&2
      rm -rf "$tmp"; return 1
    fi
    # The go command ignores a module zip's file modes and marks bin/ and
    # pkg/tool/ executable when it switches toolchains; unzip keeps the modes,
    # which are right today, and this holds if a zip ever lacks them.
    tree="$tmp/x/golang.org/toolchain@$ver"
    find "$tree/bin" "$tree/pkg/tool" -type f -exec chmod 0755 {} +
    # Renamed in one step, so a build that runs alongside sees all or nothing.
    if ! mv -T "$tree" "$dest" 2>/dev/null; then
      [[ -x "$dest/bin/go" ]] || { echo "[go] could not move Go $version to $dest" >&2; rm -rf "$tmp"; return 1; }
    fi
    rm -rf "$tmp"
    return 0
  done
  echo "[go] no proxy in GOPROXY=$proxies served golang.org/toolchain@$ver" >&2
  rm -rf "$tmp"
  return 1
}

if [[ -n "$pier_go_machine" && -x "$pier_go_machine/bin/go" ]]; then
  export PATH="$pier_go_machine/bin:$PATH"
fi
if [[ -z "$pier_go_want" ]]; then
  echo "[go] no go line in test/cluster/build/go.mod or test/upstream/build/go.mod" >&2
  return 1
fi
if ! pier_go_ok; then
  if [[ ! -x "$pier_go_dir/$pier_go_want/bin/go" ]]; then
    if command -v go >/dev/null; then
      echo "[go] $(GOTOOLCHAIN=local go version 2>&1) is older than the $pier_go_want the pinned modules need" >&2
    else
      echo "[go] no go on PATH; the pinned modules need $pier_go_want" >&2
    fi
    pier_go_fetch "$pier_go_want" "$pier_go_dir/$pier_go_want" || { echo "[go] Go >= $pier_go_want is required and could not be fetched" >&2; return 1; }
  fi
  export PATH="$pier_go_dir/$pier_go_want/bin:$PATH"
  pier_go_ok || { echo "[go] $pier_go_dir/$pier_go_want/bin/go does not run as Go $pier_go_want" >&2; return 1; }
fi
unset -f pier_go_version pier_go_ok pier_go_fetch
