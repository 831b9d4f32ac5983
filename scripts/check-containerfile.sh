#!/usr/bin/env bash
# CI check of the Containerfile without a container runtime or base images (none can be pulled in CI):
#  1. its build stage's command is `cargo build --release --locked -p vgpu-bins --bins` (locked dependencies,
#     every binary of vgpu-bins);
#  2. the binaries build from the locked dependencies: `cargo test --workspace --all-features --locked --no-run`
#     builds every binary in the dev profile — exactly what CI's test step compiled, so nothing is built
#     twice (`cargo build --bins` would unify features without dev-dependencies and rebuild half the tree);
#     the image's release profile changes optimisation, not what compiles;
#  3. every binary a chart runs (`command: ["/usr/bin/<name>"]`) is one the build produces and the image's
#     copy step (`vgpu*` executables of target/release) picks up.
# scripts/build-image.sh builds the real image where buildah is available.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "check-containerfile: $*" >&2; exit 1; }

cmd="$(sed -n 's/^RUN \(cargo build [^\\]*\).*/\1/p' Containerfile | sed 's/ *$//')"
[[ "$cmd" == "cargo build --release --locked -p vgpu-bins --bins" ]] \
  || fail "the build stage's command is '$cmd', expected 'cargo build --release --locked -p vgpu-bins --bins'"
grep -q "find target/release -maxdepth 1 -type f -executable -name 'vgpu\*'" Containerfile \
  || fail "the build stage no longer copies the vgpu* executables of target/release"

cargo test --workspace --all-features --locked --no-run
target_dir="${CARGO_TARGET_DIR:-target}"
built="$(find "$target_dir/debug" -maxdepth 1 -type f -executable -name 'vgpu*' -printf '%f\n' | sort)"
declared="$(awk '/^\[\[bin\]\]/ {b = 1; next} /^\[/ {b = 0} b && /^name = / {gsub(/name = |"/, ""); print}' bins/Cargo.toml | sort)"
for bin in $declared; do
  grep -qx "$bin" <<<"$built" || fail "binary $bin of bins/Cargo.toml was not built"
done
used="$(grep -rhoE 'command: \["/usr/bin/[a-z0-9-]+"' charts/*/templates | sed 's|.*/usr/bin/||; s|"||' | sort -u)"
for bin in $used; do
  grep -qx "$bin" <<<"$declared" || fail "a chart runs /usr/bin/$bin, which the image does not hold"
done
echo "check-containerfile: ok ($(wc -w <<<"$declared") binaries; charts run: $(echo $used))"
