#!/usr/bin/env bash
# Builds the vgpu image without pulling anything: the binaries are built on this host with the Containerfile's
# own cargo commands (every binary of vgpu-bins; the host copy of vgpu-device-client statically linked), and
# the runtime base is made from this host's files (glibc and the other libraries the binaries link, plus bash,
# coreutils, findutils, sed, cmp and mount for the scripts: what debian:bookworm-slim holds) unless
# RUNTIME_IMAGE names a pullable base. Then checks the image: `vgpuctl --version`, `device-plugin --version`
# through vgpu-manager's name, and install_files.sh into a scratch manager directory.
#
#   scripts/build-image.sh [TAG]              (default TAG: localhost/vgpu:dev)
#   PROFILE=dev scripts/build-image.sh        (debug binaries: quick, large)
#   RUNTIME_IMAGE=docker.io/library/debian:bookworm-slim scripts/build-image.sh
#   LIMITER_IMAGE=docker.io/coldzerofear/vgpu-manager:<tag> scripts/build-image.sh   (with the CUDA limiter)
#   PREBUILT=target/debug scripts/build-image.sh   (no cargo: the binaries already in that folder, debug info
#                                                   stripped; the host copy of vgpu-device-client is then that
#                                                   folder's dynamically linked one: fine for containers with
#                                                   glibc, such as the e2e tests' on the real node)
#   OCI_ARCHIVE=/tmp/vgpu.oci.tar scripts/build-image.sh   (also writes the image as an OCI archive naming TAG,
#                                                   for `ctr images import`: the real node's e2e tests; the
#                                                   buildah images, TAG and the host runtime base, are then
#                                                   removed once checked: the archive is the result.
#                                                   KEEP_IMAGE=1 keeps them)
#
# Needs buildah and podman (Debian packages); CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-localhost/vgpu:dev}"
profile="${PROFILE:-release}"
target_dir="${CARGO_TARGET_DIR:-target}"
host="$(rustc -vV | sed -n 's/^host: //p')"

case "$profile" in
  release) flags=(--release); out="$target_dir/release"; static_out="$target_dir/$host/release" ;;
  dev) flags=(); out="$target_dir/debug"; static_out="$target_dir/$host/debug" ;;
  *) echo "PROFILE must be release or dev, not $profile" >&2; exit 2 ;;
esac
if [[ -n "${PREBUILT:-}" ]]; then
  out="$PREBUILT"
  static_out="$PREBUILT"
  [[ -x "$out/vgpu-device-client" ]] || { echo "build-image: $out holds no vgpu binaries (PREBUILT)" >&2; exit 1; }
else
  cargo build "${flags[@]}" --locked -p vgpu-bins --bins
  RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build "${flags[@]}" --locked -p vgpu-bins --bin vgpu-device-client --target "$host"
fi
# target/image-bins/ is the part of target/ in the build context (.containerignore): bin/ -> /usr/bin/,
# installed/ -> /installed/.
rm -rf target/image-bins
mkdir -p target/image-bins/bin target/image-bins/installed/registry
find "$out" -maxdepth 1 -type f -executable -name 'vgpu*' -exec cp {} target/image-bins/bin/ \;
cp "$static_out/vgpu-device-client" target/image-bins/installed/registry/device-client
if [[ -n "${PREBUILT:-}" ]]; then
  # Debug builds carry hundreds of MB of debug info: the image (and an import on the node) without it.
  find target/image-bins -type f -name '*' -exec strip --strip-debug {} \;
fi
bins="$(find target/image-bins/bin -type f -printf '%f\n' | sort)"
echo "build-image: $(wc -l <<<"$bins") binaries from $out: $(tr '\n' ' ' <<<"$bins")"

if [[ -z "${RUNTIME_IMAGE:-}" ]]; then
  RUNTIME_IMAGE=localhost/vgpu-runtime-base:host
  host_base="$RUNTIME_IMAGE"
  ctr="$(buildah from scratch)"
  trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
  root="$(buildah mount "$ctr")"
  # This host's /usr merge (bin -> usr/bin, ...), so that /bin/bash and the loader's path both resolve.
  mkdir -p "$root/usr/bin" "$root/usr/sbin" "$root/usr/lib"
  # (Relative links, their targets created: nothing written through them may land on this host.)
  for dir in bin sbin lib lib64; do
    if [[ -L "/$dir" ]]; then
      link="$(readlink "/$dir")"
      link="${link#/}"
      mkdir -p "$root/$link"
      ln -s "$link" "$root/$dir"
    fi
  done
  # The tools the scripts and the DRA chart's kubelet-plugin wrapper run.
  tools=(bash sh env cat cp mv rm rmdir mkdir ln chmod mktemp sync touch readlink basename dirname date ls head
    sleep sort id stat find sed grep cmp mount umount)
  tool_paths=()
  for tool in "${tools[@]}"; do
    path="$(type -P "$tool")" || { echo "build-image: $tool is not installed on this host" >&2; exit 1; }
    tool_paths+=("$path")
    mkdir -p "$root$(dirname "$path")"
    cp -L "$path" "$root$path"
  done
  # Every shared library the binaries and tools link, at the path the loader looks for it.
  libs="$({ ldd target/image-bins/bin/* "${tool_paths[@]}" 2>/dev/null || true; } \
    | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $2 ~ /^\(/ {print $1}' | sort -u)"
  for lib in $libs; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  # pci.ids for the node agent's names (the Containerfile installs Debian's pci.ids into an apt base).
  pci_ids=""
  for candidate in /usr/share/misc/pci.ids /usr/share/hwdata/pci.ids; do
    [[ -r "$candidate" ]] && { pci_ids="$candidate"; break; }
  done
  if [[ -n "$pci_ids" ]]; then
    mkdir -p "$root/usr/share/misc"
    cp -L "$pci_ids" "$root/usr/share/misc/pci.ids"
  else
    echo "build-image: no pci.ids on this host (apt-get install pci.ids): PhysicalGPU names will be hex ids" >&2
  fi
  mkdir -p "$root/etc" "$root/tmp" "$root/root"
  chmod 1777 "$root/tmp"
  chmod 0700 "$root/root"
  printf 'root:x:0:0:root:/root:/bin/bash\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  buildah umount "$ctr" >/dev/null
  buildah commit -q "$ctr" "$RUNTIME_IMAGE" >/dev/null
  buildah rm "$ctr" >/dev/null
  trap - EXIT
  echo "build-image: runtime base $RUNTIME_IMAGE from this host: ${tools[*]}; $(tr '\n' ' ' <<<"$libs")"
fi

# With OCI_ARCHIVE the archive is the result: the images go when the script ends (checked or not), unless
# KEEP_IMAGE=1. (Each build would otherwise leave a few hundred MB in buildah's store.)
# (Also the untagged images of the intermediate stages this build made: those not there before it.)
dangling_before="$(buildah images -q --filter dangling=true 2>/dev/null | sort -u || true)"
drop_images() {
  local image
  for image in "$tag" "${host_base:-}"; do
    [[ -n "$image" ]] && buildah rmi -f "$image" >/dev/null 2>&1 || true
  done
  for image in $(buildah images -q --filter dangling=true 2>/dev/null | sort -u); do
    grep -qx "$image" <<<"$dangling_before" || buildah rmi -f "$image" >/dev/null 2>&1 || true
  done
}
if [[ -n "${OCI_ARCHIVE:-}" && "${KEEP_IMAGE:-0}" != 1 ]]; then
  trap drop_images EXIT
fi

buildah bud -q --target runtime-prebuilt --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" \
  --build-arg LIMITER_IMAGE="${LIMITER_IMAGE:-}" -t "$tag" -f Containerfile .
echo "build-image: $tag, $(podman image inspect "$tag" --format '{{.Size}}') bytes"
if [[ -n "${OCI_ARCHIVE:-}" ]]; then
  rm -f "$OCI_ARCHIVE"
  # containerd names an imported image after the archive's io.containerd.image.name / ref name: TAG.
  buildah push -q "$tag" "oci-archive:$OCI_ARCHIVE:$tag" >/dev/null
  echo "build-image: $OCI_ARCHIVE ($(stat -c %s "$OCI_ARCHIVE") bytes)"
fi

# What the image is checked with: vgpuctl, one of vgpu-manager's names, and the install step into a scratch
# manager directory (a second run must change nothing).
smoke='set -eu
vgpuctl --version
device-plugin --version
mkdir -p /tmp/manager
HOST_MANAGER_DIR=/tmp/manager /scripts/install_files.sh
HOST_MANAGER_DIR=/tmp/manager bash /usr/bin/install_files.sh | grep ": 0 file(s) written,"
ls -l /tmp/manager /tmp/manager/registry'
# Where the sandbox refuses to start containers (crun's setrlimit of RLIMIT_NPROC is "Operation not permitted"
# in some sandboxes), the image's own filesystem is run instead: chroot into the mounted image, so its loader,
# libraries and tools are the ones used.
if ! podman run --rm --ulimit nofile=1024:1024 --entrypoint /bin/bash "$tag" -c "$smoke"; then
  echo "build-image: podman cannot start containers here; checking the mounted image (chroot)" >&2
  ctr="$(buildah from "$tag")"
  mnt="$(buildah mount "$ctr")"
  status=0
  chroot "$mnt" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "$smoke" || status=$?
  buildah umount "$ctr" >/dev/null
  buildah rm "$ctr" >/dev/null
  exit "$status"
fi
