#!/usr/bin/env bash
# Builds the Helm command used by the chart tests (helm lint / helm template) at the version pinned in
# e2e/helm/go.mod (go.sum committed), into a cache folder outside the clone, and skips the build when it
# is already there. Test infrastructure only, like build-controlplane.sh.
#
#   VGPU_E2E_CACHE   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/vgpu-e2e); helm goes to
#                    $VGPU_E2E_CACHE/helm-<ver>/helm
#   VGPU_E2E_FORCE=1 rebuild even if the binary is up to date
#
# The last line printed on stdout is the helm binary's path (for VGPU_HELM).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
src="$here/helm"

version="$(awk '$1 == "require" && $2 == "helm.sh/helm/v3" { print $3; exit }' "$src/go.mod")"
if [[ -z "$version" ]]; then
  echo "build-helm: cannot read the helm version from $src/go.mod" >&2
  exit 1
fi

cache_root="${VGPU_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vgpu-e2e}"
out="$cache_root/helm-${version}"

stamp_value="$(
  { go env GOVERSION GOOS GOARCH; cat "$src/go.mod" "$src/go.sum" "$src/tools.go" "$0"; } | sha256sum | cut -d' ' -f1
)"
if [[ -x "$out/helm" && "$(cat "$out/.stamp" 2>/dev/null || true)" == "$stamp_value" && "${VGPU_E2E_FORCE:-0}" != 1 ]]; then
  echo "build-helm: up to date in $out" >&2
  echo "$out/helm"
  exit 0
fi

echo "build-helm: building helm ${version} into $out" >&2
mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.build-helm.XXXXXX")"
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT

# Version stamping as Helm's Makefile does, so `helm version` reports the release.
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${version} -X helm.sh/helm/v3/internal/version.gitTreeState=clean"

start=$SECONDS
(
  cd "$src"
  CGO_ENABLED=0 nice -n 19 go build -mod=readonly -trimpath -ldflags="$ldflags" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm
)
echo "$stamp_value" > "$tmp/.stamp"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build-helm: built in $((SECONDS - start))s; $(du -sh "$out" | cut -f1) in $out" >&2
echo "$out/helm"
