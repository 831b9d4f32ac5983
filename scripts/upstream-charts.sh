#!/usr/bin/env bash
# Runs vgpu-manager's OWN Helm charts with our image on the real node (issue #32; the e2e test
# e2e/tests/real_node_upstream_charts.rs). The charts are never part of this repository: they are taken from
# a copy of vgpu-manager's repository, read only, into a temporary folder that is removed afterwards.
#
#   scripts/upstream-charts.sh SOURCE [extra cargo test args, e.g. a test name filter]
#
# SOURCE is one of:
#   - a folder holding vgpu-manager/ and vgpu-manager-dra-driver/ (the repository's charts/ folder), used as is;
#   - a checkout of vgpu-manager's repository (it has charts/);
#   - a bare git directory of it (e.g. a mirror's .../repo): `git archive HEAD charts` is extracted
#     (REF=<commit> picks another commit).
#
# Then runs, under the real node's shared lock (/work/logs/realnode.lock when that folder exists, else
# $TMPDIR/vgpu-realnode.lock; REALNODE_LOCK overrides), the test with VGPU_UPSTREAM_CHARTS set:
#   cargo test --workspace --all-features --locked --test real_node_upstream_charts -- --ignored --nocapture
#     --test-threads=1
# Needs what e2e/run.sh needs for the real node: VGPU_E2E_BIN_DIR (control plane), VGPU_E2E_NODE_DIR (node),
# VGPU_HELM or the pinned Helm in the e2e cache, root, buildah (scripts/build-image.sh builds our image from
# the test build's binaries). The workspace's binaries are built first (cargo test --workspace --no-run), as
# e2e/run.sh does (the test target is selected within the workspace, so features unify as there and
# nothing is compiled twice).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 ]]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
source="$1"
shift

tmp="$(mktemp -d "${TMPDIR:-/tmp}/vgpu-upstream-charts.XXXXXX")"
trap 'rm -rf -- "$tmp"' EXIT
if [[ -f "$source/vgpu-manager/Chart.yaml" ]]; then
  charts="$source"
elif [[ -f "$source/charts/vgpu-manager/Chart.yaml" ]]; then
  charts="$source/charts"
elif git --git-dir="$source" rev-parse --verify -q "${REF:-HEAD}^{commit}" >/dev/null 2>&1; then
  commit="$(git --git-dir="$source" rev-parse "${REF:-HEAD}^{commit}")"
  git --git-dir="$source" archive "$commit" charts | tar -x -C "$tmp"
  charts="$tmp/charts"
  echo "upstream-charts: vgpu-manager's charts at $commit extracted into $charts"
else
  echo "upstream-charts: $source is neither a charts folder, a checkout nor a git directory of vgpu-manager" >&2
  exit 2
fi
for chart in vgpu-manager vgpu-manager-dra-driver; do
  [[ -f "$charts/$chart/Chart.yaml" ]] || { echo "upstream-charts: no $chart chart in $charts" >&2; exit 2; }
done
charts="$(cd "$charts" && pwd)"

lock="${REALNODE_LOCK:-}"
if [[ -z "$lock" ]]; then
  if [[ -d /work/logs ]]; then lock=/work/logs/realnode.lock; else lock="${TMPDIR:-/tmp}/vgpu-realnode.lock"; fi
fi

# The binaries under test come from the workspace test build (as e2e/run.sh: vgpu_e2e::vgpu_binary).
cargo test --workspace --all-features --locked --no-run
VGPU_UPSTREAM_CHARTS="$charts" flock "$lock" \
  cargo test --workspace --all-features --locked --test real_node_upstream_charts -- \
  --ignored --nocapture --test-threads=1 "$@"
