#!/usr/bin/env bash
# Builds (or reuses) the pinned control plane, then runs the ignored e2e tests one at a time.
#
#   e2e/run.sh [extra cargo test args, e.g. a test name filter]
#
# Environment: VGPU_E2E_CACHE (cache root), VGPU_E2E_BIN_DIR (skip the build and use these
# binaries), VGPU_E2E_KEEP_LOGS=1 (keep logs in target/e2e-logs/ even when tests pass).
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
if [[ -z "${VGPU_E2E_BIN_DIR:-}" ]]; then
  VGPU_E2E_BIN_DIR="$(e2e/build-controlplane.sh | tail -n1)"
  export VGPU_E2E_BIN_DIR
fi
built=$SECONDS
echo "e2e: control plane ready in $((built - start))s: $VGPU_E2E_BIN_DIR"

# Our binaries under test (vgpu-scheduler-extender, vgpu-device-plugin, vgpu-device-client; see vgpu_e2e::vgpu_binary) come from
# the workspace test build (vgpu-bins has integration tests), and the e2e test targets are selected by name within the workspace (not `-p vgpu-e2e`): features unify exactly as in
# `cargo test --workspace --all-features`, so after CI's test step nothing is compiled a second time.
# (`cargo build --bins` would unify without dev-dependencies and rebuild kube, tokio, ... .)
cargo test --workspace --all-features --locked --no-run
tests=()
for f in e2e/tests/*.rs; do tests+=(--test "$(basename "$f" .rs)"); done
cargo test --workspace --all-features --locked "${tests[@]}" -- --ignored --test-threads=1 "$@"
done_at=$SECONDS
echo "e2e: control plane $((built - start))s, tests (build + run) $((done_at - built))s, total $((done_at - start))s"
