#!/usr/bin/env bash
# Builds (or reuses) the pinned control plane, then runs the ignored e2e tests one at a time.
#
#   e2e/run.sh [extra cargo test args, e.g. a test name filter]
#
# Environment: VGPU_E2E_CACHE (cache root), VGPU_E2E_BIN_DIR (skip the build and use these
# binaries), VGPU_E2E_KEEP_LOGS=1 (keep logs in target/e2e-logs/ even when tests pass),
# VGPU_E2E_NODE_DIR (the real node's binaries: skip e2e/build-node.sh), VGPU_E2E_NODE_BUILD=0 (never build
# the real node: its tests then use the cache or skip), VGPU_E2E_NFD_DIR (node-feature-discovery: skip
# e2e/build-nfd.sh), VGPU_E2E_NFD_BUILD=0 (never build NFD: tests/nfd.rs then uses the cache or skips).
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
if [[ -z "${VGPU_E2E_BIN_DIR:-}" ]]; then
  VGPU_E2E_BIN_DIR="$(e2e/build-controlplane.sh | tail -n1)"
  export VGPU_E2E_BIN_DIR
fi
built=$SECONDS
echo "e2e: control plane ready in $((built - start))s: $VGPU_E2E_BIN_DIR"

# The real node (kubelet, containerd, images: vgpu_e2e::real_node). A node that cannot be built is no
# failure: the real-node tests then skip, each saying why.
if [[ -z "${VGPU_E2E_NODE_DIR:-}" && "${VGPU_E2E_NODE_BUILD:-auto}" != 0 ]]; then
  if node_dir="$(e2e/build-node.sh | tail -n1)" && [[ -n "$node_dir" ]]; then
    export VGPU_E2E_NODE_DIR="$node_dir"
    echo "e2e: real node ready in $((SECONDS - built))s: $VGPU_E2E_NODE_DIR"
  else
    echo "e2e: e2e/build-node.sh failed: the real-node tests will skip" >&2
  fi
fi
node_built=$SECONDS

# node-feature-discovery (nfd-master, nfd-worker: tests/nfd.rs). Like the node: a failed build only makes that
# test skip.
if [[ -z "${VGPU_E2E_NFD_DIR:-}" && "${VGPU_E2E_NFD_BUILD:-auto}" != 0 ]]; then
  if nfd_dir="$(e2e/build-nfd.sh | tail -n1)" && [[ -n "$nfd_dir" ]]; then
    export VGPU_E2E_NFD_DIR="$nfd_dir"
    echo "e2e: node-feature-discovery ready in $((SECONDS - node_built))s: $VGPU_E2E_NFD_DIR"
  else
    echo "e2e: e2e/build-nfd.sh failed: the NFD test will skip" >&2
  fi
fi
nfd_built=$SECONDS

# Our binaries under test (vgpu-scheduler-extender, vgpu-device-plugin, vgpu-device-client; see vgpu_e2e::vgpu_binary) come from
# the workspace test build (vgpu-bins has integration tests), and the e2e test targets are selected by name within the workspace (not `-p vgpu-e2e`): features unify exactly as in
# `cargo test --workspace --all-features`, so after CI's test step nothing is compiled a second time.
# (`cargo build --bins` would unify without dev-dependencies and rebuild kube, tokio, ... .)
cargo test --workspace --all-features --locked --no-run
tests=()
for f in e2e/tests/*.rs; do tests+=(--test "$(basename "$f" .rs)"); done
cargo test --workspace --all-features --locked "${tests[@]}" -- --ignored --test-threads=1 "$@"
done_at=$SECONDS
echo "e2e: control plane $((built - start))s, real node $((node_built - built))s, NFD $((nfd_built - node_built))s, tests (build + run) $((done_at - nfd_built))s, total $((done_at - start))s"
