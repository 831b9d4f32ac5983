#!/usr/bin/env bash
# Builds node-feature-discovery's nfd-master and nfd-worker for the NFD e2e test (e2e/tests/nfd.rs) at the
# version pinned in e2e/nfd/go.mod (go.sum committed), into a cache folder outside the clone, and skips the
# build when they are already there. Test infrastructure only, like build-controlplane.sh.
#
#   VGPU_E2E_CACHE   cache root (default: ${XDG_CACHE_HOME:-~/.cache}/vgpu-e2e); the binaries and NFD's
#                    CRDs (nfd-api-crds.yaml) go to $VGPU_E2E_CACHE/nfd-<ver>/
#   VGPU_E2E_FORCE=1 rebuild even if the binaries are up to date
#
# nfd-worker reads the local feature files from a directory fixed at build time
# (source/local.featureFilesDir, /etc/kubernetes/node-feature-discovery/features.d/). The build sets it to
# the relative path `features.d/` with `-X`, so a worker started in a scratch directory reads that
# directory's features.d/ and the test needs no root and no host path.
#
# The last line printed on stdout is the binary folder (for VGPU_E2E_NFD_DIR).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
src="$here/nfd"
module=sigs.k8s.io/node-feature-discovery

version="$(awk '$1 == "require" && $2 == "'"$module"'" { print $3; exit }' "$src/go.mod")"
if [[ -z "$version" ]]; then
  echo "build-nfd: cannot read the node-feature-discovery version from $src/go.mod" >&2
  exit 1
fi

cache_root="${VGPU_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vgpu-e2e}"
out="$cache_root/nfd-${version}"
bins=(nfd-master nfd-worker)

stamp_value="$(
  { go env GOVERSION GOOS GOARCH; cat "$src/go.mod" "$src/go.sum" "$src/tools.go" "$0"; } | sha256sum | cut -d' ' -f1
)"
up_to_date=1
for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || up_to_date=0; done
[[ -s "$out/nfd-api-crds.yaml" ]] || up_to_date=0
[[ "$(cat "$out/.stamp" 2>/dev/null || true)" == "$stamp_value" ]] || up_to_date=0
if [[ "$up_to_date" == 1 && "${VGPU_E2E_FORCE:-0}" != 1 ]]; then
  echo "build-nfd: up to date in $out" >&2
  echo "$out"
  exit 0
fi

echo "build-nfd: building node-feature-discovery ${version} into $out" >&2
mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.build-nfd.XXXXXX")"
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT

# Version stamping as NFD's Makefile does (pkg/version.version), and the feature-file directory (above).
ldflags="-s -w -X $module/pkg/version.version=${version}"
ldflags+=" -X $module/source/local.featureFilesDir=features.d/"

start=$SECONDS
(
  cd "$src"
  CGO_ENABLED=0 nice -n 19 go build -mod=readonly -trimpath -ldflags="$ldflags" -o "$tmp/" \
    "$module/cmd/nfd-master" "$module/cmd/nfd-worker"
  # The NodeFeature, NodeFeatureRule and NodeFeatureGroup CRDs of the same release, from the module.
  cp "$(go list -mod=readonly -m -f '{{.Dir}}' "$module")/deployment/base/nfd-crds/nfd-api-crds.yaml" "$tmp/"
)
chmod 644 "$tmp/nfd-api-crds.yaml"
echo "$stamp_value" > "$tmp/.stamp"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "build-nfd: built in $((SECONDS - start))s; $(du -sh "$out" | cut -f1) in $out" >&2
echo "$out"
