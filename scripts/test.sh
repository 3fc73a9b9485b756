#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), the cluster and image builds
# (cached), typecheck, build, then every vitest project: unit, integration
# (real kube-apiserver) and e2e (network namespaces and real nodes; needs
# root). Extra arguments go to vitest, e.g. `--project unit`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

bash scripts/setup.sh
source scripts/node-env.sh
export PIER_CLUSTER_BIN_DIR="$(bash test/cluster/build.sh)"
# pier's two images, the pause image and the test pods' echo image, built by
# buildah from their Dockerfiles (cached in .cache/images).
export PIER_IMAGES_DIR="$(bash test/images/build.sh)"

echo "[test] typecheck and build" >&2
npx tsc -p tsconfig.json
npx tsc -p tsconfig.build.json

mkdir -p test-results
status=0
npx vitest run --reporter=default --reporter=json --outputFile.json=test-results/vitest.json "$@" || status=$?
node scripts/summary.ts test-results/vitest.json || status=1
exit "$status"
