#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), the cluster and image builds
# (cached), typecheck, build, then every vitest project: unit, integration
# (real kube-apiserver) and e2e (network namespaces and real nodes; needs
# root), then Kubernetes' own LoadBalancer specs against pier. Extra
# arguments go to vitest alone, e.g. `--project unit`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/setup.sh
source scripts/node-env.sh
export PIER_CLUSTER_BIN_DIR="$(bash test/cluster/build.sh)"
# pier's two images, the pause image and the test pods' echo image, built by
# buildah from their Dockerfiles (cached in .cache/images).
export PIER_IMAGES_DIR="$(bash test/images/build.sh)"
# helm and actionlint built from their Go modules, and the prometheus-operator
# ServiceMonitor and PodMonitor CRDs from its module, for the Helm chart's and
# the release workflow's tests (test/helm/build.sh; cached in .cache/).
export PIER_HELM="$(bash test/helm/build.sh helm)"
# Helm 3 too: the chart's tests lint and render it with both majors.
export PIER_HELM3="$(bash test/helm/build.sh helm3)"
export PIER_ACTIONLINT="$(bash test/helm/build.sh actionlint)"
export PIER_PROMETHEUS_CRDS="$(bash test/helm/build.sh prometheus-crds)"

echo "[test] typecheck and build" >&2
npx tsc -p tsconfig.json
npx tsc -p tsconfig.build.json

mkdir -p test-results
status=0
npx vitest run --reporter=default --reporter=json --outputFile.json=test-results/vitest.json "$@" || status=$?

# Kubernetes' own LoadBalancer specs (test/upstream) on both backends at once,
# one real-node cluster each on the lab's two sites; a whole run only (no
# vitest arguments, PIER_UPSTREAM unset or 1). Each prints its table.
backends=(iptables nftables)
if [[ $# -eq 0 && "${PIER_UPSTREAM:-1}" == 1 ]]; then
  echo "[test] upstream LoadBalancer specs, iptables and nftables backends at once" >&2
  if bash test/upstream/build.sh >/dev/null; then
    pids=()
    for site in 0 1; do
      node test/upstream/run.ts --backend "${backends[$site]}" --site "$site" \
        >"test-results/upstream-${backends[$site]}.txt" 2>"test-results/upstream-${backends[$site]}.log" &
      pids+=($!)
    done
    for site in 0 1; do
      backend="${backends[$site]}"
      if ! wait "${pids[$site]}"; then
        status=1
        echo "[test] upstream specs on $backend failed; its log (test-results/upstream-$backend.log) ends:" >&2
        tail -n 30 "test-results/upstream-$backend.log" >&2
      fi
      cat "test-results/upstream-$backend.txt"
    done
    for backend in "${backends[@]}"; do
      echo "upstream specs ($backend): $(tail -n 1 "test-results/upstream-$backend.txt")"
    done
  else
    status=1
  fi
fi
node scripts/summary.ts test-results/vitest.json || status=1
exit "$status"
