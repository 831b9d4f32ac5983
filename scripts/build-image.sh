#!/usr/bin/env bash
# Builds the vgpu image without pulling anything: the binaries are built on this host with the Containerfile's
# own cargo command, and the runtime base is made from this host's glibc (the libraries distroless/cc-debian12
# holds) unless RUNTIME_IMAGE names a pullable base. Then runs `vgpuctl --version` in the image.
#
#   scripts/build-image.sh [TAG]              (default TAG: localhost/vgpu:dev)
#   PROFILE=dev scripts/build-image.sh        (debug binaries: quick, large)
#   RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot scripts/build-image.sh
#
# Needs buildah and podman (Debian packages); CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-localhost/vgpu:dev}"
profile="${PROFILE:-release}"
target_dir="${CARGO_TARGET_DIR:-target}"

case "$profile" in
  release) cargo build --release --locked -p vgpu-bins --bins; out="$target_dir/release" ;;
  dev) cargo build --locked -p vgpu-bins --bins; out="$target_dir/debug" ;;
  *) echo "PROFILE must be release or dev, not $profile" >&2; exit 2 ;;
esac
rm -rf target/image-bins
mkdir -p target/image-bins
find "$out" -maxdepth 1 -type f -executable -name 'vgpu*' -exec cp {} target/image-bins/ \;
echo "build-image: $(ls target/image-bins | wc -l) binaries from $out: $(ls target/image-bins | tr '\n' ' ')"

if [[ -z "${RUNTIME_IMAGE:-}" ]]; then
  RUNTIME_IMAGE=localhost/vgpu-runtime-base:host
  ctr="$(buildah from scratch)"
  trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
  root="$(buildah mount "$ctr")"
  # Every shared library the binaries link, at the path the loader looks for it.
  libs="$(ldd target/image-bins/* | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)"
  for lib in $libs; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  mkdir -p "$root/etc" "$root/tmp" "$root/usr/bin"
  chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  buildah umount "$ctr" >/dev/null
  buildah commit -q "$ctr" "$RUNTIME_IMAGE" >/dev/null
  buildah rm "$ctr" >/dev/null
  trap - EXIT
  echo "build-image: runtime base $RUNTIME_IMAGE from this host's libraries: $(echo $libs | tr '\n' ' ')"
fi

buildah bud -q --target runtime-prebuilt --build-arg RUNTIME_IMAGE="$RUNTIME_IMAGE" -t "$tag" -f Containerfile .
echo "build-image: $tag, $(podman image inspect "$tag" --format '{{.Size}}') bytes"
# The image's entrypoint is vgpuctl. Where the sandbox refuses to start containers (crun's setrlimit of
# RLIMIT_NPROC is "Operation not permitted" in some sandboxes), the image's own filesystem is run instead:
# chroot into the mounted image as the image's user, so its loader and libraries are the ones used.
if ! podman run --rm --ulimit nofile=1024:1024 "$tag" --version; then
  echo "build-image: podman cannot start containers here; running vgpuctl from the mounted image (chroot, uid 65532)" >&2
  ctr="$(buildah from "$tag")"
  mnt="$(buildah mount "$ctr")"
  status=0
  chroot --userspec=65532:65532 "$mnt" /usr/bin/vgpuctl --version || status=$?
  buildah umount "$ctr" >/dev/null
  buildah rm "$ctr" >/dev/null
  exit "$status"
fi
