#!/usr/bin/env bash
# Every library crate compiled from its own packaged files, as crates.io would receive them.
#
#  1. `cargo package --no-verify` writes each library crate's `.crate` (manifest normalised, only the files the
#     package holds, its Cargo.lock).
#  2. Each `.crate` is unpacked into `$target/package-verify/<name>-<version>/` and becomes a workspace of its own
#     (an empty `[workspace]` table; `[patch.crates-io]` points our other crates at their unpacked packages, the
#     local-registry overlay `cargo package` uses for unpublished siblings).
#  3. `cargo check --lib` in each, with that package's own dependency resolution and default features — what
#     `cargo package`'s verification builds — and, for a package with features, once more with
#     `--all-features` (what docs.rs builds).
#
# Why `check` and not `cargo package`'s own verification build: building every package from its files
# recompiles the dependency tree for each package's feature set (13.6 min of CI's 2 cores, beyond its
# budget); type-checking each one catches the same packaging faults (a file left out of the package, a
# feature or dependency declared only by a sibling, a path that reaches outside the crate) in a fraction
# of that. Code generation, which `check` skips, does not depend on how a crate was packaged.
# The full verification: `K8S_OPENAPI_ENABLED_VERSION=1.37 cargo package --workspace --exclude vgpu-bins
# --exclude vgpu-e2e --locked`.
set -euo pipefail
cd "$(dirname "$0")/.."
export K8S_OPENAPI_ENABLED_VERSION="${K8S_OPENAPI_ENABLED_VERSION:-1.37}"
meta="$(cargo metadata --format-version 1 --no-deps --locked)"
target="$(jq -r .target_directory <<<"$meta")"
# The workspace members with `publish = false` (binaries, e2e) are not packaged.
excludes=()
for p in $(jq -r '.packages[] | select(.publish == []) | .name' <<<"$meta"); do excludes+=(--exclude "$p"); done

cargo package --workspace "${excludes[@]}" --locked --no-verify --allow-dirty

# "name version has-features" of the packaged (publishable) workspace members
mapfile -t members < <(jq -r '.packages[] | select(.publish != []) | "\(.name) \(.version) \(.features | length > 0)"' <<<"$meta")
out="$target/package-verify"
rm -rf "$out"
mkdir -p "$out"
patch="[patch.crates-io]"$'\n'
for m in "${members[@]}"; do
  read -r name version _ <<<"$m"
  tar -xzf "$target/package/$name-$version.crate" -C "$out"
  patch+="$name = { path = \"../$name-$version\" }"$'\n'
done
for m in "${members[@]}"; do
  read -r name version _ <<<"$m"
  dir="$out/$name-$version"
  printf '\n[workspace]\n\n%s' "$patch" >>"$dir/Cargo.toml"
done

export CARGO_TARGET_DIR="$target"
not_used='warning: [Pp]atch .* was not used|Check that the patched package version|Perhaps you misspelled'
check() { (cd "$1" && cargo check --lib --offline --quiet "${@:2}" 2> >(grep -Ev "$not_used" >&2)); }
failed=()
for m in "${members[@]}"; do
  read -r name version features <<<"$m"
  dir="$out/$name-$version"
  echo "verify-packages: $name $version"
  # --offline: every dependency is in the local registry cache already (the workspace resolved them);
  # the packaged Cargo.lock pins the versions.
  check "$dir" || failed+=("$name")
  if [[ "$features" == true ]]; then
    check "$dir" --all-features || failed+=("$name (--all-features)")
  fi
done
if ((${#failed[@]})); then
  echo "verify-packages: these packages do not compile from their packaged files: ${failed[*]}" >&2
  exit 1
fi
echo "verify-packages: ok (${#members[@]} packages)"
