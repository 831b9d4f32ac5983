#!/usr/bin/env bash
# Init container of vgpu-manager's DRA kubelet-plugin DaemonSet (`bash /usr/bin/kubelet-plugin-prestart.sh`):
# waits until the NVIDIA driver is usable under NVIDIA_DRIVER_ROOT on the host, so that a node whose driver
# is not set up yet shows an actionable message in this container's log instead of a crash-looping plugin.
#
# The chart mounts the parent of NVIDIA_DRIVER_ROOT (the host's "/" when the root is "/") at
# /driver-root-parent, with HostToContainer propagation when it is not "/": a driver container (GPU Operator)
# that mounts the driver later becomes visible. This script makes /driver-root a symlink to
# /driver-root-parent/<last element of NVIDIA_DRIVER_ROOT> (possibly dangling at first), then, every
# PRESTART_RETRY_INTERVAL seconds (default 10), looks for nvidia-smi (opt/bin, usr/bin, usr/sbin, bin, sbin)
# and libnvidia-ml.so.1 (usr/lib64, usr/lib/<arch>-linux-gnu, lib64, lib/<arch>-linux-gnu) under it and runs
# `env -i LD_PRELOAD=<libnvidia-ml.so.1> <nvidia-smi>`; exit status 0 of nvidia-smi means the driver works.
#
# Exit status (as vgpu-manager's own script): 0 once nvidia-smi succeeds, or on SIGTERM (the pod is being
# deleted, e.g. when the GPU Operator's driver container mounts /run/nvidia); otherwise it keeps retrying,
# with hints every 6th attempt. Two additions, both off in the chart: PRESTART_MAX_ATTEMPTS=N (N > 0) gives
# up with exit status 1 after N failed attempts; and when /driver-root-parent itself is missing (the chart's
# driver-root-parent volume is not mounted: a retry cannot help) it exits 1 at once.
# The kubelet's plugin and registry directories (KUBELET_PLUGINS_DIRECTORY_PATH,
# KUBELET_REGISTRAR_DIRECTORY_PATH) are only logged: the chart mounts them into the plugin container, not
# into this one, and the plugin checks them when it starts.
#
# Environment: NVIDIA_DRIVER_ROOT (host path, default "/"); for tests: DRIVER_ROOT_PARENT (default
# /driver-root-parent), DRIVER_ROOT_LINK (default /driver-root), PRESTART_RETRY_INTERVAL, PRESTART_MAX_ATTEMPTS.
set -euo pipefail

driver_root="${NVIDIA_DRIVER_ROOT:-}"
# Not set, or empty (not distinguishable): "/", as everywhere else.
[[ -n "$driver_root" ]] || driver_root=/
export NVIDIA_DRIVER_ROOT="$driver_root"
parent="${DRIVER_ROOT_PARENT:-/driver-root-parent}"
link="${DRIVER_ROOT_LINK:-/driver-root}"
interval="${PRESTART_RETRY_INTERVAL:-10}"
max_attempts="${PRESTART_MAX_ATTEMPTS:-0}"

now() { date -u +"%Y-%m-%dT%H:%M:%SZ"; }
log() { echo "$(now) kubelet-plugin-prestart: $*"; }

sleep_pid=""
on_sigterm() {
  if [[ -n "$sleep_pid" ]]; then kill "$sleep_pid" 2>/dev/null || true; fi
  log "received SIGTERM, leaving"
  exit 0
}
trap on_sigterm TERM

if [[ ! "$max_attempts" =~ ^[0-9]+$ ]]; then
  log "PRESTART_MAX_ATTEMPTS must be a number, not '$max_attempts'" >&2
  exit 2
fi

log "NVIDIA_DRIVER_ROOT=$driver_root; kubelet plugins directory ${KUBELET_PLUGINS_DIRECTORY_PATH:-(unset)}, plugin registry ${KUBELET_REGISTRAR_DIRECTORY_PATH:-(unset)} (checked by the plugin)"

if [[ ! -d "$parent" ]]; then
  log "error: $parent does not exist: the parent directory of NVIDIA_DRIVER_ROOT ('$driver_root') on the host is not mounted into this container (the chart's driver-root-parent volume); check the chart's kubeletPlugin.driverRoot" >&2
  exit 1
fi

# "/" -> "/driver-root-parent/" (its own parent); "/run/nvidia/driver/" -> "/driver-root-parent/driver".
trimmed="${driver_root%/}"
target="$parent/${trimmed##*/}"
# For the hints: without a trailing slash ("/" stays "/").
root="${trimmed:-/}"
if [[ -d "$link" && ! -L "$link" ]]; then
  log "$link is a directory already (not a symlink): using it as the driver root"
else
  # Possibly dangling at first: it heals once the driver is mounted (GPU Operator: /run/nvidia/driver).
  log "create symlink: $link -> $target"
  ln -sfn -- "$target" "$link"
fi

common_error() {
  echo "Check failed. Has the NVIDIA GPU driver been set up? It is expected to be installed under" \
    "NVIDIA_DRIVER_ROOT (currently '$driver_root') in the host filesystem. If that path is unexpected," \
    "review the chart's 'kubeletPlugin.driverRoot' value; otherwise check that the GPU driver has actually" \
    "been installed under that path."
}

# The first match of file name $1 (maxdepth 1, -L: libnvidia-ml.so.1 is usually a link) in the directories
# $2..; nothing when none. find's complaints about the directories that do not exist are silenced.
find_first() {
  local name="$1"
  shift
  { find -L "$@" -maxdepth 1 -type f -name "$name" 2>/dev/null || true; } | head -n1
}

# One attempt: returns 0 when nvidia-smi ran with exit status 0.
attempt() {
  local n="$1" smi lib rc contents
  smi="$(find_first nvidia-smi "$link/opt/bin" "$link/usr/bin" "$link/usr/sbin" "$link/bin" "$link/sbin")"
  lib="$(find_first libnvidia-ml.so.1 "$link/usr/lib64" "$link/usr/lib/x86_64-linux-gnu" \
    "$link/usr/lib/aarch64-linux-gnu" "$link/lib64" "$link/lib/x86_64-linux-gnu" "$link/lib/aarch64-linux-gnu")"
  contents="$(ls -xAw0 -- "$link/" 2>/dev/null || true)"
  log "$link ($driver_root on the host): nvidia-smi: ${smi:-not found}, libnvidia-ml.so.1: ${lib:-not found}, current contents: [$contents]"

  if [[ -n "$smi" && -n "$lib" ]]; then
    # A clean environment but LD_PRELOAD (nvidia-smi's only dependency); said before it runs, as it may hang.
    log "invoke: env -i LD_PRELOAD=$lib $smi"
    rc=0
    env -i LD_PRELOAD="$lib" "$smi" || rc=$?
    if ((rc == 0)); then
      log "nvidia-smi returned with exit status 0: the driver is set up"
      return 0
    fi
    log "nvidia-smi returned with exit status $rc (see 'RETURN VALUE' in nvidia-smi(1))"
  fi

  # Hints on the first attempt, then every 6th (about once a minute).
  ((n % 6 == 0)) || return 1
  common_error
  if [[ "$root" != / ]]; then
    if [[ -z "$contents" ]]; then
      echo "Hint: directory $driver_root on the host is empty or missing."
    elif [[ -z "$smi" || -z "$lib" ]]; then
      echo "Hint: directory $driver_root on the host is not empty, but nvidia-smi or libnvidia-ml.so.1 was not found in it."
    fi
  fi
  if [[ "$root" == / && -f "$link/run/nvidia/driver/usr/bin/nvidia-smi" ]]; then
    echo "Hint: /run/nvidia/driver/usr/bin/nvidia-smi exists on the host: you may want to reinstall the chart with --set kubeletPlugin.driverRoot=/run/nvidia/driver."
  fi
  if [[ "$root" == /run/nvidia/driver ]]; then
    echo "Hint: NVIDIA_DRIVER_ROOT is /run/nvidia/driver, which usually means that the NVIDIA GPU Operator manages the driver: check that it is deployed and healthy."
  fi
  return 1
}

n=0
while true; do
  if attempt "$n"; then
    exit 0
  fi
  n=$((n + 1))
  if ((max_attempts > 0 && n >= max_attempts)); then
    log "error: the NVIDIA driver under NVIDIA_DRIVER_ROOT ('$driver_root') is still not usable after $n attempt(s) (PRESTART_MAX_ATTEMPTS=$max_attempts), giving up" >&2
    exit 1
  fi
  # In the background so that SIGTERM is handled at once, not after the sleep.
  sleep "$interval" &
  sleep_pid=$!
  wait "$sleep_pid" || true
  sleep_pid=""
done
