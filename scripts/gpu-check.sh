#!/usr/bin/env bash
# GPU check for the NVML backend, on a machine with an NVIDIA GPU and driver.
#
#   scripts/gpu-check.sh            # from anywhere; results also saved under $OUT (default target/gpu-check)
#
# What it does (about 1-3 minutes cold on 16 cores, debug build since that is the fastest cold):
#   1. builds vgpuctl and the vgpu-nvml tests (offline);
#   2. runs `vgpuctl devices --backend nvml --json --topology` (saved as devices.json);
#   3. runs the NVML-gated tests `cargo test -p vgpu-nvml --tests -- --ignored` (UUID format, memory > 0,
#      bus ids equal to `nvidia-smi --query-gpu=pci.bus_id`, PCI device ids with NVIDIA's vendor id,
#      driver/CUDA versions, topology, health stream);
#   4. MIG create/destroy (`nvml::tests::mig_create_destroy_on_gpu`, VGPU_MIG_CHECK=1): only on a GPU that is
#      already in MIG mode with no MIG devices — creates the smallest profile at its last placement, checks
#      the ids and placement `mig_layout` reports, destroys it (also on failure) and checks the GPU has no MIG
#      devices again. It never changes the MIG mode, so with MIG off (the usual case) it prints SKIP and
#      passes. Set VGPU_MIG_CHECK=0 to leave MIG alone entirely;
#   5. prints a summary; exits 1 if any step failed.
#
# Offline: the GPU machine has no network. Cargo runs with CARGO_NET_OFFLINE=true, so the crates must already
# be in the cargo home (`cargo fetch` run beforehand on a machine with network, and ~/.cargo/registry, or
# $CARGO_HOME, carried along), or vendored with a matching .cargo/config.toml.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
export CARGO_NET_OFFLINE="${CARGO_NET_OFFLINE:-true}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-0}"   # no debug info: faster cold build
OUT="${OUT:-target/gpu-check}"
mkdir -p "$OUT"

declare -a SUMMARY=()
FAILED=0
record() { # name status
    SUMMARY+=("$(printf '%-34s %s' "$1" "$2")")
    [ "$2" = PASS ] || FAILED=1
}
run_step() { # name timeout_s command...
    local name="$1" limit="$2"; shift 2
    echo "=== $name: $*"
    local start=$SECONDS
    if timeout "$limit" "$@" 2>&1 | tee "$OUT/$(echo "$name" | tr ' /' '__').log"; then
        record "$name ($((SECONDS - start))s)" PASS
        return 0
    fi
    record "$name ($((SECONDS - start))s)" FAIL
    return 1
}

if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L | tee "$OUT/nvidia-smi-L.txt"
    nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.total,driver_version --format=csv | tee "$OUT/nvidia-smi.csv"
else
    echo "nvidia-smi not found: the bus-id cross-check is skipped"
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install the Rust toolchain (1.89 or newer) first" >&2
    exit 1
fi
if ! cargo metadata --format-version 1 >/dev/null 2>"$OUT/metadata.err"; then
    echo "cargo cannot resolve the workspace offline:" >&2
    cat "$OUT/metadata.err" >&2
    echo "run 'cargo fetch' with network first and carry ~/.cargo/registry (or \$CARGO_HOME)" >&2
    exit 1
fi

run_step "build vgpuctl + nvml tests" 210 \
    bash -c 'cargo build -p vgpu-bins --bin vgpuctl && cargo test -p vgpu-nvml --tests --no-run'

if [ -x target/debug/vgpuctl ]; then
    echo "=== vgpuctl devices --backend nvml --json --topology"
    start=$SECONDS
    if timeout 30 target/debug/vgpuctl devices --backend nvml --json --topology >"$OUT/devices.json" 2>"$OUT/devices.err"; then
        cat "$OUT/devices.json"
        record "vgpuctl devices ($((SECONDS - start))s)" PASS
        target/debug/vgpuctl devices --backend nvml --topology | tee "$OUT/devices.txt"
    else
        cat "$OUT/devices.err" >&2
        record "vgpuctl devices ($((SECONDS - start))s)" FAIL
    fi
else
    record "vgpuctl devices" "SKIP (not built)"
fi

run_step "nvml ignored tests" 60 env -u VGPU_MIG_CHECK cargo test -p vgpu-nvml --tests -- --ignored --nocapture

if [ "${VGPU_MIG_CHECK:-1}" = 1 ]; then
    run_step "nvml MIG create/destroy" 90 env VGPU_MIG_CHECK=1 \
        cargo test -p vgpu-nvml --lib -- --ignored --exact nvml::tests::mig_create_destroy_on_gpu --nocapture
else
    echo "=== nvml MIG create/destroy: skipped (VGPU_MIG_CHECK=$VGPU_MIG_CHECK)"
fi

echo
echo "=== summary (logs in $OUT)"
for line in "${SUMMARY[@]}"; do echo "$line"; done
if [ -s "$OUT/devices.json" ] && command -v python3 >/dev/null 2>&1; then
    python3 - "$OUT/devices.json" <<'PY' || true
import json, sys
doc = json.load(open(sys.argv[1]))
drv = doc.get("driver") or {}
print(f"driver {drv.get('version')} cuda {drv.get('cuda')}: {len(doc['devices'])} GPU(s)")
for d in doc["devices"]:
    print(f"  {d['index']} {d['uuid']} {d['name']} {d['memoryMiB']} MiB bus {d['busId']} numa {d['numa']} cc {d['capability']} mig {d['mig']}")
PY
fi
exit "$FAILED"
