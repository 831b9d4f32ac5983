#!/usr/bin/env bash
# Pod start-up on the real node (issue #31 item 5): e2e/tests/real_node_startup.rs creates plain busybox pods,
# vGPU pods (our extender + vgpu-device-plugin) and DRA claim pods (vgpu-kubelet-plugin) one at a time, in
# interleaved rounds, on the upstream kubelet + containerd of e2e/build-node.sh, and prints pod create → Running
# p50/p99 per kind and the p50 ratios to plain pods.
#
#   scripts/node-startup.sh        # 50 pods of each kind
#   scripts/node-startup.sh 20     # 20 of each
#
# Needs root (the real node), the control plane (VGPU_E2E_BIN_DIR, else e2e/build-controlplane.sh builds it)
# and the node (VGPU_E2E_NODE_DIR, else e2e/build-node.sh builds it). Our binaries are built with --release.
set -euo pipefail
cd "$(dirname "$0")/.."

pods="${1:-50}"
if [[ -z "${VGPU_E2E_BIN_DIR:-}" ]]; then
  VGPU_E2E_BIN_DIR="$(e2e/build-controlplane.sh | tail -n1)"
  export VGPU_E2E_BIN_DIR
fi
if [[ -z "${VGPU_E2E_NODE_DIR:-}" ]]; then
  VGPU_E2E_NODE_DIR="$(e2e/build-node.sh | tail -n1)"
  export VGPU_E2E_NODE_DIR
fi
target="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
cargo build --release -p vgpu-bins --bin vgpu-scheduler-extender --bin vgpu-device-plugin --bin vgpu-kubelet-plugin
export VGPU_E2E_VGPU_BIN_DIR="$target/release"
VGPU_NODE_STARTUP_PODS="$pods" timeout 1800 \
  cargo test -q -p vgpu-e2e --test real_node_startup -- --ignored --nocapture --test-threads=1
