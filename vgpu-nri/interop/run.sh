#!/usr/bin/env bash
# Runs vgpu-nri's example plugin against upstream's NRI runtime adaptation (containerd/nri v0.12.1, the
# code containerd embeds): registration, Synchronize, CreateContainer's adjustment, RemoveContainer, then a
# second runtime on the same socket (the plugin reconnects), and answers larger than one 4096-byte frame.
# Needs Go and the Go module proxy; manual, not part of `cargo test`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/go" "$work/run"
cp "$here/main.go" "$work/go/"
(cd "$work/go" && go mod init vgpu-nri-interop >/dev/null 2>&1 && go get github.com/containerd/nri@v0.12.1 >/dev/null 2>&1 \
  && go mod tidy >/dev/null 2>&1 && go build -o "$work/runtime" .)
(cd "$here/.." && cargo build -q --example env_plugin)
plugin="${CARGO_TARGET_DIR:-$here/../../target}/debug/examples/env_plugin"
for pad in 0 9000 300000; do
  rm -rf "$work/run" && mkdir -p "$work/run"
  VGPU_EXAMPLE_PAD=$pad timeout 60 "$plugin" "$work/run" 10 2 >"$work/plugin.out" 2>&1 &
  pid=$!
  for round in 1 2; do
    timeout 30 "$work/runtime" "$work/run/nri.sock" >"$work/runtime$round.out" 2>&1
    grep -q '^ADJUST .*VGPU_EXAMPLE_POD' "$work/runtime$round.out" || { cat "$work/runtime$round.out"; exit 1; }
    if grep -qi 'level=error' "$work/runtime$round.out"; then cat "$work/runtime$round.out"; exit 1; fi
  done
  wait "$pid"
  grep -q '^DONE' "$work/plugin.out" || { cat "$work/plugin.out"; exit 1; }
  echo "ok: answer padding $pad bytes, two runtimes in a row"
done
