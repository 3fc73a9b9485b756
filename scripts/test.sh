#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), the builds (cached machine-wide,
# scripts/cache-env.sh), typecheck, build, every vitest project (unit,
# integration against a real kube-apiserver, e2e in network namespaces and on
# real nodes; needs root), and Kubernetes' own LoadBalancer specs against pier
# on both backends. Extra arguments go to vitest alone, e.g. `--project unit`
# (the upstream specs are then left out).
#
# The two cores are spent on the longest path: once Kubernetes and the images
# are built, the upstream specs build and run in the background, on lab sites
# of their own (1 to 4: each backend's specs split over PIER_UPSTREAM_SHARDS
# clusters), and the helm tools build, while vitest runs on site 0. The run
# ends with a table of
# its stages, vitest's slowest files, and one closing line that counts vitest
# and the upstream specs together (scripts/summary.ts).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# This run's results only: an earlier run's files are never read.
rm -rf test-results
mkdir -p test-results
export PIER_STAGES="$root/test-results/stages.tsv"
run_start=$SECONDS

# timed NAME CMD...: runs CMD as one stage of the run; its start, length and
# exit status go to the stages table.
timed() {
  local name="$1" t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$((t0 - run_start))" "$((SECONDS - t0))" "$rc" >>"$PIER_STAGES"
  return "$rc"
}

# built VAR NAME CMD...: a cached build whose stdout is a path, exported as
# VAR. Its progress goes to stderr and test-results/build-NAME.log; a failed
# build stops the run here, with the end of its log.
built() {
  local var="$1" name="$2" out log="test-results/build-$2.log"
  shift 2
  if ! out="$(timed "build $name" "$@" 2> >(tee "$log" >&2))"; then
    sleep 1 # tee may still be writing the log's last lines
    echo "[test] building $name failed; the end of $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  export "$var=$out"
}

# background CMD...: a build beside the tests, at a lower CPU priority so that
# the tests' timings (refused at once, no SYN lost) see the cores first.
background() { nice -n 10 "$@"; }

upstream=false
[[ $# -eq 0 && "${PIER_UPSTREAM:-1}" == 1 ]] && upstream=true
shards="${PIER_UPSTREAM_SHARDS:-2}"
[[ "$shards" == 1 || "$shards" == 2 ]] || { echo "[test] PIER_UPSTREAM_SHARDS=$shards: 1 or 2 (the lab has four sites besides the tests' own)" >&2; exit 2; }
backends=(iptables nftables)

timed setup bash scripts/setup.sh --no-cluster
source scripts/node-env.sh
built PIER_CLUSTER_BIN_DIR cluster bash test/cluster/build.sh
# pier's two images, the pause image and the test pods' echo image, built by
# buildah from their Dockerfiles.
built PIER_IMAGES_DIR images bash test/images/build.sh

# Kubernetes' own LoadBalancer specs (test/upstream), in the background: their
# build, then every shard of both backends at once, each a real-node cluster
# on a lab site of its own. Each shard writes its table and a JSON of its
# outcomes into test-results/.
upstream_specs() {
  local log=test-results/build-upstream.log pids=() backend k site=1 rc=0
  if ! timed 'build upstream' background bash test/upstream/build.sh >/dev/null 2>"$log"; then
    echo "[test] building the upstream specs failed; the end of $log:" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
  for backend in "${backends[@]}"; do
    for ((k = 1; k <= shards; k++, site++)); do
      node test/upstream/run.ts --backend "$backend" --site "$site" --shard "$k/$shards" --json "test-results/upstream-$backend-$k.json" --long-after "$vitest_done" \
        >"test-results/upstream-$backend-$k.txt" 2>"test-results/upstream-$backend-$k.log" &
      pids+=($!)
    done
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return "$rc"
}
# The upstream specs' long rolling-update specs wait for this (run.ts says why).
vitest_done=test-results/vitest.done
summary=(--vitest test-results/vitest.json --stages "$PIER_STAGES")
# A whole run checks that every README command a test claims ran (readme.ts).
if [[ $# -eq 0 ]]; then
  export PIER_README_RUNS="$root/test-results/readme-runs.txt"
  summary+=(--readme-runs "$PIER_README_RUNS")
fi
if $upstream; then
  echo "[test] upstream LoadBalancer specs: building, then ${#backends[@]} backends x $shards shards on lab sites 1-$((${#backends[@]} * shards)), in the background" >&2
  timed 'upstream specs (build and run)' upstream_specs &
  upstream_pid=$!
  for backend in "${backends[@]}"; do
    for ((k = 1; k <= shards; k++)); do summary+=(--upstream "test-results/upstream-$backend-$k.json"); done
  done
fi

# helm and actionlint built from their Go modules, and the prometheus-operator
# ServiceMonitor and PodMonitor CRDs from its module, for the Helm chart's and
# the release workflow's tests; Helm 3 too: the chart's tests lint and render
# it with both majors. Only those tests need them, so they build in the
# background beside the first tests, and each tool's path (or its failure)
# lands in PIER_TOOLS_DIR, where test/helm/tools.ts waits for it.
export PIER_TOOLS_DIR="$root/test-results/tools"
mkdir -p "$PIER_TOOLS_DIR"
helm_tools() {
  local tool out rc=0 log
  for tool in helm helm3 actionlint prometheus-crds; do
    log="test-results/build-$tool.log"
    if out="$(timed "build $tool" background bash test/helm/build.sh "$tool" 2>"$log")"; then
      printf '%s\n' "$out" >"$PIER_TOOLS_DIR/$tool.tmp"
      mv "$PIER_TOOLS_DIR/$tool.tmp" "$PIER_TOOLS_DIR/$tool.path"
    else
      printf '%s\n' "$root/$log" >"$PIER_TOOLS_DIR/$tool.failed"
      echo "[test] building $tool failed; the end of $log:" >&2
      tail -n 40 "$log" >&2
      rc=1
    fi
  done
  return "$rc"
}
helm_tools &
tools_pid=$!
# Background jobs of a script ignore SIGINT: a run that stops early (a failed
# build, Ctrl-C) stops them. The tool builds go as a whole tree (a build left
# running would hold the cache's lock); the upstream shards get SIGTERM and
# take down their clusters themselves.
stop_background() {
  local tree=("$tools_pid") i=0
  while ((i < ${#tree[@]})); do
    tree+=($(pgrep -P "${tree[i]}" || true))
    i=$((i + 1))
  done
  kill -TERM "${tree[@]}" 2>/dev/null || true
  if [[ -n "${upstream_pid:-}" ]] && kill -0 "$upstream_pid" 2>/dev/null; then pkill -TERM -P "$upstream_pid" || true; fi
  wait
}
trap stop_background EXIT

# tsc is single-threaded: the typecheck and dist/ take a core each.
echo "[test] typecheck and build" >&2
timed typecheck npx tsc -p tsconfig.json &
typecheck_pid=$!
timed 'build dist' npx tsc -p tsconfig.build.json
wait "$typecheck_pid"

status=0
timed vitest npx vitest run --reporter=default --reporter=json --outputFile.json=test-results/vitest.json "$@" || status=1
touch "$vitest_done"
# A failed tool build fails the run, whether or not a test needed the tool.
wait "$tools_pid" || status=1

if $upstream; then
  echo "[test] waiting for the upstream specs" >&2
  if ! wait "$upstream_pid"; then
    status=1
    for log in test-results/upstream-*.log; do
      [[ -e "$log" ]] || continue
      echo "[test] $log ends:" >&2
      tail -n 15 "$log" >&2
    done
  fi
  for txt in test-results/upstream-*.txt; do [[ -e "$txt" ]] && cat "$txt"; done
fi
node scripts/summary.ts "${summary[@]}" || status=1
echo "[test] finished in $((SECONDS - run_start))s" >&2
exit "$status"
