#!/usr/bin/env bash
# Builds the real node of the e2e tests (vgpu_e2e::real_node): the upstream kubelet and kube-proxy at the
# version pinned in e2e/controlplane/go.mod, containerd, its runc shim and ctr at the version pinned in
# e2e/node/go.mod, and the two test images as OCI archives, into a cache folder outside the clone;
# skips the build when they are already there. runc, the CNI plugins, iptables, conntrack, the static
# busybox, and buildah, podman and pci.ids (scripts/build-image.sh: the image the chart tests install) come
# from Debian packages, installed here with apt-get when missing.
#
#   VGPU_E2E_CACHE   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/vgpu-e2e);
#                    the node goes to $VGPU_E2E_CACHE/node-k8s-<ver>_containerd-<ver>/
#   VGPU_E2E_FORCE=1 rebuild even if the node is up to date
#
# The images are written by this script, nothing is downloaded for them:
#   registry.local/vgpu-e2e/busybox:1  Debian's static busybox at /bin/busybox with a link per applet
#                                      in /bin, a minimal /etc/passwd and /etc/group; Cmd ["sh"]
#   registry.local/vgpu-e2e/pause:1    e2e/node/pause alone (holds the namespaces, reaps, exits on TERM)
# each as an OCI image-layout tar (uncompressed layer, config, manifest, index.json naming the image).
#
# The last line printed on stdout is the node folder (for VGPU_E2E_NODE_DIR).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cp_src="$here/controlplane"
node_src="$here/node"

k8s_version="$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$cp_src/go.mod")"
containerd_version="$(awk '$1 == "github.com/containerd/containerd/v2" { print $2; exit }' "$node_src/go.mod")"
if [[ -z "$k8s_version" || -z "$containerd_version" ]]; then
  echo "build-node: cannot read versions from $cp_src/go.mod and $node_src/go.mod" >&2
  exit 1
fi

cache_root="${VGPU_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vgpu-e2e}"
out="$cache_root/node-k8s-${k8s_version}_containerd-${containerd_version}"
bins=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr)
images=(busybox.oci.tar pause.oci.tar)

# Debian packages the node runs with (the command or file that shows each one is there).
declare -A package_of=(
  [runc]=runc
  [/usr/lib/cni/bridge]=containernetworking-plugins
  [iptables]=iptables
  [conntrack]=conntrack
  [ip]=iproute2
  [busybox-static]=busybox-static
  # scripts/build-image.sh: our image for the chart tests (real_node_helm, real_node_upstream_charts)
  [buildah]=buildah
  [podman]=podman
  [/usr/share/misc/pci.ids]=pci.ids
)
missing=()
for probe in "${!package_of[@]}"; do
  case "$probe" in
    /*) [[ -e "$probe" ]] || missing+=("${package_of[$probe]}") ;;
    busybox-static) # the dynamic `busybox` package also installs /bin/busybox: ask dpkg
      dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' \
        || missing+=(busybox-static) ;;
    *) PATH="$PATH:/usr/sbin:/sbin" command -v "$probe" >/dev/null || missing+=("${package_of[$probe]}") ;;
  esac
done
if (( ${#missing[@]} > 0 )); then
  echo "build-node: installing Debian packages: ${missing[*]}" >&2
  sudo_cmd=()
  if [[ $(id -u) != 0 ]] && command -v sudo >/dev/null; then sudo_cmd=(sudo -n); fi
  apt_install() {
    # Waits for a concurrent apt-get (CI installs prometheus in the background) instead of failing.
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=300 install -y -q \
      --no-install-recommends "${missing[@]}"
  }
  if ! apt_install >&2; then
    "${sudo_cmd[@]}" apt-get update -q >&2
    apt_install >&2
  fi
fi
busybox=/bin/busybox
if [[ ! -x "$busybox" ]]; then
  echo "build-node: $busybox is missing (Debian package busybox-static)" >&2
  exit 1
fi

# The stamp covers everything that decides the build output.
stamp_value="$(
  {
    go env GOVERSION GOOS GOARCH
    cat "$cp_src/go.mod" "$cp_src/go.sum" "$cp_src/kubelet/main.go" "$cp_src/kube-proxy/main.go"
    cat "$node_src/go.mod" "$node_src/go.sum" "$node_src/pause/main.go" "$0"
    sha256sum "$busybox"
  } | sha256sum | cut -d' ' -f1
)"

up_to_date=1
for f in "${bins[@]}" "${images[@]}"; do [[ -s "$out/$f" ]] || up_to_date=0; done
[[ "$(cat "$out/.stamp" 2>/dev/null || true)" == "$stamp_value" ]] || up_to_date=0
if [[ "$up_to_date" == 1 && "${VGPU_E2E_FORCE:-0}" != 1 ]]; then
  echo "build-node: up to date in $out" >&2
  echo "$out"
  exit 0
fi

echo "build-node: building kubelet + kube-proxy ${k8s_version} + containerd ${containerd_version} into $out (this takes a while)" >&2
mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.build-node.XXXXXX")"
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT

start=$SECONDS
# kubelet: version stamping as build-controlplane.sh does (upstream's hack/lib/version.sh).
minor="${k8s_version#v1.}"; minor="${minor%%.*}"
vpkg="k8s.io/component-base/version"
k8s_ldflags="-s -w -X ${vpkg}.gitVersion=${k8s_version} -X ${vpkg}.gitMajor=1 -X ${vpkg}.gitMinor=${minor}"
k8s_ldflags+=" -X ${vpkg}.gitTreeState=clean -X ${vpkg}.buildDate=1970-01-01T00:00:00Z"
(
  cd "$cp_src"
  CGO_ENABLED=0 nice -n 19 go build -mod=readonly -trimpath -ldflags="$k8s_ldflags" -o "$tmp/" ./kubelet ./kube-proxy
)
kubelet_done=$SECONDS

# containerd as its Makefile builds it, less the snapshotters and tracing the node does not use; the shim
# without gRPC (ttrpc only), as upstream ships it. CGO off: btrfs is then left out by its build tag.
ctr_pkg="github.com/containerd/containerd/v2"
ctr_ldflags="-s -w -X ${ctr_pkg}/version.Version=${containerd_version} -X ${ctr_pkg}/version.Package=${ctr_pkg}"
(
  cd "$node_src"
  CGO_ENABLED=0 nice -n 19 go build -mod=readonly -trimpath -ldflags="$ctr_ldflags" \
    -tags "urfave_cli_no_docs no_devmapper no_zfs no_tracing" -o "$tmp/" \
    "${ctr_pkg}/cmd/containerd" "${ctr_pkg}/cmd/ctr" ./pause
  CGO_ENABLED=0 nice -n 19 go build -mod=readonly -trimpath -ldflags="$ctr_ldflags" \
    -tags "urfave_cli_no_docs no_grpc" -o "$tmp/" "${ctr_pkg}/cmd/containerd-shim-runc-v2"
)
containerd_done=$SECONDS

# --- OCI images -----------------------------------------------------------------------------------
arch="$(go env GOARCH)"
# Reproducible tars: sorted, owned by root, dated 1970.
det_tar() { tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu "$@"; }
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# oci_image REF OUT_TAR ROOTFS CONFIG_JSON: packs ROOTFS as the one layer of an image whose container
# config (Env, Entrypoint, Cmd, ...) is CONFIG_JSON, into an OCI image-layout tar naming it REF.
oci_image() {
  local ref="$1" out_tar="$2" rootfs="$3" config="$4"
  local layout
  layout="$(mktemp -d "$tmp/layout.XXXXXX")"
  mkdir -p "$layout/blobs/sha256"
  det_tar -C "$rootfs" -cf "$layout/layer.tar" .
  local layer_digest layer_size
  layer_digest="$(sha256_of "$layout/layer.tar")"
  layer_size="$(stat -c %s "$layout/layer.tar")"
  mv "$layout/layer.tar" "$layout/blobs/sha256/$layer_digest"

  printf '{"architecture":"%s","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created_by":"e2e/build-node.sh"}]}' \
    "$arch" "$config" "$layer_digest" >"$layout/config.json"
  local config_digest config_size
  config_digest="$(sha256_of "$layout/config.json")"
  config_size="$(stat -c %s "$layout/config.json")"
  mv "$layout/config.json" "$layout/blobs/sha256/$config_digest"

  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$config_digest" "$config_size" "$layer_digest" "$layer_size" >"$layout/manifest.json"
  local manifest_digest manifest_size
  manifest_digest="$(sha256_of "$layout/manifest.json")"
  manifest_size="$(stat -c %s "$layout/manifest.json")"
  mv "$layout/manifest.json" "$layout/blobs/sha256/$manifest_digest"

  # containerd names an imported image after io.containerd.image.name; the OCI annotation holds the tag.
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_digest" "$manifest_size" "$arch" "$ref" "${ref##*:}" >"$layout/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
  det_tar -C "$layout" -cf "$out_tar" oci-layout index.json blobs
  rm -rf "$layout"
}

path_env='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'

rootfs="$tmp/rootfs-busybox"
mkdir -p "$rootfs"/{bin,etc,root,tmp,proc,sys,dev,usr/bin}
chmod 1777 "$rootfs/tmp"
chmod 700 "$rootfs/root"
cp "$busybox" "$rootfs/bin/busybox"
for applet in $("$busybox" --list); do
  [[ "$applet" == busybox || -e "$rootfs/bin/$applet" ]] || ln -s busybox "$rootfs/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
oci_image registry.local/vgpu-e2e/busybox:1 "$tmp/busybox.oci.tar" "$rootfs" \
  "{\"Env\":[$path_env],\"Cmd\":[\"sh\"],\"WorkingDir\":\"/\"}"

rootfs="$tmp/rootfs-pause"
mkdir -p "$rootfs"
mv "$tmp/pause" "$rootfs/pause"
oci_image registry.local/vgpu-e2e/pause:1 "$tmp/pause.oci.tar" "$rootfs" \
  "{\"Env\":[$path_env],\"Entrypoint\":[\"/pause\"],\"WorkingDir\":\"/\"}"
rm -rf "$tmp"/rootfs-*

echo "$stamp_value" > "$tmp/.stamp"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build-node: built in $((SECONDS - start))s (kubelet $((kubelet_done - start))s, containerd $((containerd_done - kubelet_done))s, images $((SECONDS - containerd_done))s); $(du -sh "$out" | cut -f1) in $out" >&2
echo "$out"
