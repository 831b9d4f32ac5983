#!/usr/bin/env bash
# Builds the upstream control-plane binaries used by the e2e tests (kube-apiserver,
# kube-scheduler, kube-controller-manager, etcd) at the versions pinned in e2e/controlplane/go.mod, into a
# cache folder outside the clone, and skips the build when they are already there.
#
#   VGPU_E2E_CACHE   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/vgpu-e2e);
#                    binaries go to $VGPU_E2E_CACHE/k8s-<ver>_etcd-<ver>/
#   VGPU_E2E_FORCE=1 rebuild even if the binaries are up to date
#
# The last line printed on stdout is the binary folder (for VGPU_E2E_BIN_DIR).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
src="$here/controlplane"

k8s_version="$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$src/go.mod")"
etcd_version="$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2; exit }' "$src/go.mod")"
if [[ -z "$k8s_version" || -z "$etcd_version" ]]; then
  echo "build-controlplane: cannot read versions from $src/go.mod" >&2
  exit 1
fi

cache_root="${VGPU_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vgpu-e2e}"
out="$cache_root/k8s-${k8s_version}_etcd-${etcd_version}"
bins=(kube-apiserver kube-scheduler kube-controller-manager etcd)

# The stamp covers everything that decides the build output.
stamp_value="$(
  {
    go env GOVERSION GOOS GOARCH
    cat "$src/go.mod" "$src/go.sum" "$0"
    for b in "${bins[@]}"; do cat "$src/$b/main.go"; done
  } | sha256sum | cut -d' ' -f1
)"

up_to_date=1
for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || up_to_date=0; done
[[ "$(cat "$out/.stamp" 2>/dev/null || true)" == "$stamp_value" ]] || up_to_date=0
if [[ "$up_to_date" == 1 && "${VGPU_E2E_FORCE:-0}" != 1 ]]; then
  echo "build-controlplane: up to date in $out" >&2
  echo "$out"
  exit 0
fi

echo "build-controlplane: building k8s ${k8s_version} + etcd ${etcd_version} into $out (this takes a while)" >&2
mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT

# Version stamping as upstream's hack/lib/version.sh does, so /version reports the real release.
minor="${k8s_version#v1.}"; minor="${minor%%.*}"
vpkg="k8s.io/component-base/version"
ldflags="-s -w -X ${vpkg}.gitVersion=${k8s_version} -X ${vpkg}.gitMajor=1 -X ${vpkg}.gitMinor=${minor}"
ldflags+=" -X ${vpkg}.gitTreeState=clean -X ${vpkg}.buildDate=1970-01-01T00:00:00Z"

start=$SECONDS
(
  cd "$src"
  CGO_ENABLED=0 nice -n 19 go build -mod=readonly -trimpath -ldflags="$ldflags" -o "$tmp/" \
    ./kube-apiserver ./kube-scheduler ./kube-controller-manager ./etcd
)
echo "$stamp_value" > "$tmp/.stamp"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build-controlplane: built in $((SECONDS - start))s; $(du -sh "$out" | cut -f1) in $out" >&2
echo "$out"
