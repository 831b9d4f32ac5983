#!/usr/bin/env bash
# Scheduling throughput under the real kube-scheduler (issue #22 item 1): e2e/tests/scheduler_throughput.rs at
# the sizes of the issue, configuration (a) kube-scheduler alone with nvidia.com/gpu pods, (v) kube-scheduler
# alone with the vGPU pods of (b) counted as plain extended resources (the cost of the pod shape itself),
# (b) with our extender and vGPU pods, (c) kube-scheduler alone with DRA claims on our ResourceSlices, each
# on a fresh control plane; prints pods/s per size and the ratios (b)/(a), (b)/(v) (the extender's own cost)
# and (c)/(a), and the extender's CPU milliseconds per pod in (b) (its utime + stime over the run).
#
#   scripts/throughput.sh                 # 200x1000, 1000x1000, 200x5000, 1000x5000 (nodes x pods)
#   scripts/throughput.sh 50x200 200x1000 # chosen sizes
#   VGPU_THROUGHPUT_REPEAT=3 scripts/throughput.sh 200x1000   # a, v, b, c interleaved 3 times: medians
#
# (b) runs kube-scheduler -> extender over HTTPS (HTTP/2) unless VGPU_THROUGHPUT_EXTENDER_TLS=0 (plain HTTP/1.1); each
# (b) run prints its connections per 1,000 extender calls.
#
# On a small shared machine the control plane is CPU-bound and one run varies by ±20 %: repeat and compare
# the medians. VGPU_THROUGHPUT_CONFIGS (default "a v b c") leaves configurations out.
#
# Environment: VGPU_E2E_BIN_DIR (control-plane binaries; else e2e/build-controlplane.sh builds them),
# CARGO_TARGET_DIR (where our binaries are built). Our binaries are built with --release (the extender's speed
# is part of what is measured). Bounded: each run stops after 600 s.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(200x1000 1000x1000 200x5000 1000x5000)
if [[ -z "${VGPU_E2E_BIN_DIR:-}" ]]; then
  VGPU_E2E_BIN_DIR="$(e2e/build-controlplane.sh | tail -n1)"
  export VGPU_E2E_BIN_DIR
fi
target="${CARGO_TARGET_DIR:-target}"
cargo build --release -p vgpu-bins --bin vgpu-scheduler-extender
# Absolute: the tests run in e2e/, where a relative target/ would name another folder.
export VGPU_E2E_VGPU_BIN_DIR="$(cd "$target/release" && pwd)"
cargo test -p vgpu-e2e --test scheduler_throughput --no-run

repeat="${VGPU_THROUGHPUT_REPEAT:-1}"
read -r -a configs <<<"${VGPU_THROUGHPUT_CONFIGS:-a v b c}"
median() { tr ' ' '\n' | { grep . || true; } | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
printf '%-12s %11s %11s %11s %11s %8s %8s %8s %14s   (median of %s)\n' "nodes x pods" "(a) pods/s" "(v) pods/s" \
  "(b) pods/s" "(c) pods/s" "(b)/(a)" "(b)/(v)" "(c)/(a)" "ext CPU ms/pod" "$repeat"
for s in "${sizes[@]}"; do
  nodes="${s%x*}" pods="${s#*x}"
  declare -A runs=([a]="" [v]="" [b]="" [c]="")
  ext_ms=""
  for ((r = 1; r <= repeat; r++)); do
    for config in "${configs[@]}"; do
      out="$(VGPU_THROUGHPUT_NODES="$nodes" VGPU_THROUGHPUT_PODS="$pods" \
        cargo test -q -p vgpu-e2e --test scheduler_throughput "throughput_${config}_" -- --ignored --nocapture \
        --test-threads=1 2>/dev/null || true)"
      line="$(grep '^throughput ' <<<"$out" || true)"
      [[ -n "$line" ]] || { echo "config $config at $s failed (rerun with e2e/run.sh throughput_${config}_)" >&2; exit 1; }
      runs[$config]+=" ${line##*pods_per_s=}"
      # The extender's CPU over the run (utime + stime from /proc/<pid>/stat, the test's "cpu seconds:" line).
      if [[ "$config" == b ]]; then
        ext_s="$(grep '^cpu seconds:' <<<"$out" | grep -o 'vgpu-scheduler-extender [0-9.]*' | awk '{ print $2 }' || true)"
        [[ -n "$ext_s" ]] && ext_ms+=" $(awk -v c="$ext_s" -v n="$pods" 'BEGIN { printf "%.3f", c * 1000 / n }')"
      fi
      echo "  $s run $r: $line $(grep '^cpu seconds:' <<<"$out" || true)" >&2
      grep '^extender connections:' <<<"$out" | sed 's/^/    /' >&2 || true
    done
  done
  declare -A rate=()
  for config in a v b c; do rate[$config]="$(echo "${runs[$config]}" | median)"; done
  ratio() { awk -v d="${rate[$2]}" -v x="${rate[$1]}" 'BEGIN { if (d == "-" || x == "-") print "-"; else printf "%.2f", x / d }'; }
  printf '%-12s %11s %11s %11s %11s %8s %8s %8s %14s\n' "$s" "${rate[a]}" "${rate[v]}" "${rate[b]}" "${rate[c]}" \
    "$(ratio b a)" "$(ratio b v)" "$(ratio c a)" "$(echo "$ext_ms" | median)"
done
