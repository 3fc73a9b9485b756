# Sourced by test/images/build.sh and test/upstream/build.sh: one buildah
# storage per caller, and images cached by key. The caller sets `out` (the
# cache folder: keys/, <name>.tar), `storage`, `runroot`, `driver`, `work`
# (scratch, on the same filesystem as `out`) and defines `indent`.

bh() { buildah --root "$storage" --runroot "$runroot" --storage-driver "$driver" "$@"; }

sha() { sha256sum | cut -c1-64; }
# The source of shell functions: a change to how an image is built changes its key.
recipe() { declare -f "$@" | sha; }

image_id() { bh inspect --type image --format '{{.FromImageID}}' "$1"; }

# An image is fresh when its key matches the one recorded when it was built,
# its name still points at the recorded id and its archive exists.
fresh() {
  local name="$1" ref="$2" key="$3" k id current
  [[ -f "$out/keys/$name" && -f "$out/$name.tar" ]] || return 1
  read -r k id <"$out/keys/$name"
  [[ "$k" == "$key" ]] || return 1
  current="$(image_id "$ref" 2>/dev/null)" || return 1
  [[ "$current" == "$id" ]]
}

# docker-archive, the format `ctr images import` and `docker load` read, under the image's full name.
export_archive() {
  local name="$1" ref="$2" key="$3" id
  id="$(image_id "$ref")"
  rm -f "$work/$name.tar"
  bh push --quiet "$id" "docker-archive:$work/$name.tar:$ref" 2>&1 | indent
  mv "$work/$name.tar" "$out/$name.tar"
  echo "$key $id" >"$out/keys/$name"
}
