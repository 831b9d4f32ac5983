#!/usr/bin/env bash
# Installs the host files this image carries under /installed/ onto the host manager directory
# ($HOST_MANAGER_DIR, default /etc/vgpu-manager, a hostPath the chart mounts at the same path). vgpu-manager's
# charts run it as an init container of the device-plugin DaemonSet (`/bin/bash -c /scripts/install_files.sh`)
# and of the DRA kubelet-plugin DaemonSet (`bash -c /usr/bin/install_files.sh`); the image holds it at both
# paths.
#
# What /installed/ holds (Containerfile): libvgpu-control.so.<version> (the in-container CUDA limiter, only
# when the image was built with LIMITER_IMAGE), ld.so.preload (naming /etc/vgpu-manager/driver/libvgpu-control.so,
# where the plugins mount that library in a vGPU container), registry/device-client, maybe tools/.
#
# Every regular file of the source tree is installed at the same relative path:
#  - a file whose destination already has the same content is skipped (its mtime is left alone), so a rerun
#    (every pod restart) changes nothing;
#  - otherwise it is written to a temporary file in the destination directory (mode and mtime of the source,
#    flushed to disk) and renamed over the destination: a reader (a container starting meanwhile) sees the
#    old file or the new one, never a partial one;
#  - a symlink at a destination is replaced, never followed (rename(2) replaces the link itself); a symlink
#    in place of a destination directory, or a directory in place of a destination file, is refused (a
#    container runtime leaves an empty directory where a bind-mount source was missing: that one is removed
#    and replaced);
#  - missing directories are created 0755 (umask 022).
# The control library is installed before ld.so.preload. Without a control library in the source,
# ld.so.preload is NOT installed: a preload file naming a library that is not there would break every
# process of a vGPU container. The script then says so and exits 0: the device plugin and the kubelet plugin
# check both files (vgpu_core::abi::runtime_files::check) and refuse vGPU containers, with a message that says
# what to install, until they are there. A file already at the destination is never removed.
#
# Environment: HOST_MANAGER_DIR (destination, must exist: the chart mounts it), INSTALLED_DIR (source,
# default /installed). Exit status: 0 installed (or nothing to do); 1 the source or destination directory is
# missing, or some file could not be installed (the others still are).
set -euo pipefail
umask 022

src_dir="${INSTALLED_DIR:-/installed}"
src_dir="${src_dir%/}"
dest_dir="${HOST_MANAGER_DIR:-/etc/vgpu-manager}"
[[ "$dest_dir" == / ]] || dest_dir="${dest_dir%/}"
preload=ld.so.preload
library_glob='libvgpu-control.so.?*'

log() { echo "install_files: $*"; }
err() { echo "install_files: error: $*" >&2; }

if [[ ! -d "$src_dir" ]]; then
  err "source directory $src_dir does not exist (INSTALLED_DIR)"
  exit 1
fi
if [[ ! -d "$dest_dir" ]]; then
  err "destination directory $dest_dir does not exist (HOST_MANAGER_DIR; the chart mounts the host manager directory there)"
  exit 1
fi

tmp=""
cleanup() { if [[ -n "$tmp" ]]; then rm -f -- "$tmp"; fi; }
trap cleanup EXIT

# Makes the directory `$1` (relative to $dest_dir, "." for the destination itself) without following a
# symlink below $dest_dir. Returns 1 (after saying why) when a component is not a directory.
ensure_dir() {
  local path="$dest_dir" part parts
  [[ "$1" == . ]] && return 0
  IFS=/ read -r -a parts <<<"$1"
  for part in "${parts[@]}"; do
    path="$path/$part"
    if [[ -L "$path" ]]; then
      err "$path is a symlink, not a directory: refusing to follow it (remove it and rerun)"
      return 1
    elif [[ -d "$path" ]]; then
      continue
    elif [[ -e "$path" ]]; then
      err "$path is not a directory"
      return 1
    fi
    mkdir -m 0755 -- "$path" || { err "cannot create directory $path"; return 1; }
  done
}

# Installs the source file `$1` (relative path `$2`). Returns 1 (after saying why) when it could not.
install_file() {
  local src="$1" rel="$2" dest="$dest_dir/$2" rel_dir action
  rel_dir="$(dirname -- "$rel")"
  ensure_dir "$rel_dir" || return 1
  if [[ -L "$dest" ]]; then
    action="replace symlink $rel (-> $(readlink -- "$dest"); the link is replaced, its target left alone)"
  elif [[ -d "$dest" ]]; then
    # What a container runtime leaves when a container started before this file was installed.
    if ! rmdir -- "$dest" 2>/dev/null; then
      err "$dest is a non-empty directory, not a file: remove it and rerun"
      return 1
    fi
    action="replace empty directory $rel (left by a container runtime) with the file"
  elif [[ -e "$dest" && ! -f "$dest" ]]; then
    err "$dest is a special file, not a regular file: remove it and rerun"
    return 1
  elif [[ -f "$dest" ]]; then
    if cmp -s -- "$src" "$dest"; then
      log "unchanged $rel"
      unchanged=$((unchanged + 1))
      return 0
    fi
    action="replace $rel"
  else
    action="copy $rel"
  fi
  tmp="$(mktemp -- "$dest_dir/$rel_dir/.$(basename -- "$rel").install.XXXXXX")" \
    || { err "cannot create a temporary file next to $dest"; return 1; }
  if ! cp --preserve=mode,timestamps -- "$src" "$tmp" || ! sync -- "$tmp" || ! mv -f -T -- "$tmp" "$dest"; then
    err "cannot install $src as $dest"
    rm -f -- "$tmp"
    tmp=""
    return 1
  fi
  tmp=""
  log "$action"
  written=$((written + 1))
}

# Every regular file of the source, ld.so.preload last (after the library it names). (lastpipe: the loops
# run in this shell, without process substitution, which needs /dev/fd.)
shopt -s lastpipe
files=()
find "$src_dir/" -type f -printf '%P\0' | sort -z | while IFS= read -r -d '' rel; do
  [[ "$rel" == "$preload" ]] || files+=("$rel")
done
library_present=false
find "$src_dir/" -maxdepth 1 -type f -name "$library_glob" -printf '%P\0' | while IFS= read -r -d '' _; do
  library_present=true
done
if [[ -f "$src_dir/$preload" ]]; then
  if [[ "$library_present" == true ]]; then
    files+=("$preload")
  else
    log "not installing $preload: it would name a library that is not there"
  fi
fi

failed=0 written=0 unchanged=0
for rel in "${files[@]}"; do
  install_file "$src_dir/$rel" "$rel" || failed=$((failed + 1))
done

if [[ "$library_present" != true ]]; then
  log "WARNING: this image holds no vGPU control library (libvgpu-control.so.<version>) in $src_dir, so none was installed into $dest_dir:" \
    "the device plugin and the kubelet plugin will refuse vGPU containers (\"vGPU runtime file ... is missing\") until" \
    "libvgpu-control.so.<version> and $preload are installed there (an image built with --build-arg LIMITER_IMAGE=<vgpu-manager image> installs them)"
fi
if ((failed > 0)); then
  err "$failed file(s) could not be installed into $dest_dir"
  exit 1
fi
log "installed $src_dir into $dest_dir: $written file(s) written, $unchanged unchanged"
