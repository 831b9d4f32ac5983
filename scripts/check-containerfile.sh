#!/usr/bin/env bash
# CI check of the Containerfile without a container runtime or base images (none can be pulled in CI):
#  1. its build stage's command is `cargo build --release --locked -p vgpu-bins --bins` (locked dependencies,
#     every binary of vgpu-bins);
#  2. the binaries build from the locked dependencies: `cargo test --workspace --all-features --locked --no-run`
#     builds every binary in the dev profile — exactly what CI's test step compiled, so nothing is built
#     twice (`cargo build --bins` would unify features without dev-dependencies and rebuild half the tree);
#     the image's release profile changes optimisation, not what compiles;
#  3. every binary a chart runs (`command: ["/usr/bin/<name>"]`) is one the build produces and the image's
#     copy step (`vgpu*` executables of target/release) picks up;
#  4. vgpu-manager's charts run the image unchanged: each name they run (device-plugin, device-monitor,
#     device-scheduler, device-webhook, kubelet-plugin; device-client) is a symlink to one of our binaries,
#     the image holds install_files.sh (/usr/bin and /scripts) and kubelet-plugin-prestart.sh, both scripts
#     parse (`bash -n`; shellcheck too where it is installed), and the static device client goes to
#     /installed/registry/device-client;
#  5. the runtime base holds pci.ids (Debian's package; the offline base copies the host's).
# scripts/build-image.sh builds the real image where buildah is available; bins/tests/install_scripts.rs runs the
# scripts.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "check-containerfile: $*" >&2; exit 1; }

cmd="$(sed -n 's/^RUN \(cargo build [^\\]*\).*/\1/p' Containerfile | sed 's/ *$//')"
[[ "$cmd" == "cargo build --release --locked -p vgpu-bins --bins" ]] \
  || fail "the build stage's command is '$cmd', expected 'cargo build --release --locked -p vgpu-bins --bins'"
grep -q "find target/release -maxdepth 1 -type f -executable -name 'vgpu\*'" Containerfile \
  || fail "the build stage no longer copies the vgpu* executables of target/release"
grep -q -- "cargo build --release --locked -p vgpu-bins --bin vgpu-device-client --target" Containerfile \
  || fail "the build stage no longer builds the static vgpu-device-client"
grep -q 'out-installed/registry/device-client' Containerfile \
  || fail "the build stage no longer puts the device client at /installed/registry/device-client"
for script in install_files.sh kubelet-plugin-prestart.sh; do
  [[ -x "scripts/$script" ]] || fail "scripts/$script is missing or not executable"
  bash -n "scripts/$script" || fail "scripts/$script does not parse"
  grep -q "^COPY .*scripts/$script.* /usr/bin/" Containerfile || fail "the image does not hold /usr/bin/$script"
done
if command -v shellcheck >/dev/null; then
  shellcheck scripts/install_files.sh scripts/kubelet-plugin-prestart.sh || fail "shellcheck"
fi
grep -q 'apt-get install -y --no-install-recommends pci.ids' Containerfile \
  || fail "the runtime base no longer installs pci.ids (the node agent names PhysicalGPUs from it)"
grep -q 'cp -L "$pci_ids" "$root/usr/share/misc/pci.ids"' scripts/build-image.sh \
  || fail "scripts/build-image.sh's host-made base no longer brings pci.ids"
grep -q 'ln -s /usr/bin/install_files.sh /scripts/install_files.sh' Containerfile \
  || fail "the image does not hold /scripts/install_files.sh (vgpu-manager's device-plugin chart runs it)"

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
# vgpu-manager's names: `ln -s <our binary> /usr/bin/<their name>` in the Containerfile.
links="$(sed -n 's|.*ln -s \(vgpu[a-z-]*\) /usr/bin/\([a-z-]*\);.*|\2=\1|p' Containerfile)"
for name in device-plugin device-monitor device-scheduler device-webhook kubelet-plugin device-client; do
  bin="$(sed -n "s/^$name=//p" <<<"$links")"
  [[ -n "$bin" ]] || fail "the image has no /usr/bin/$name (a name vgpu-manager's charts run)"
  grep -qx "$bin" <<<"$declared" || fail "/usr/bin/$name links to $bin, which the image does not hold"
done
echo "check-containerfile: ok ($(wc -w <<<"$declared") binaries; charts run: $(paste -sd' ' <<<"$used");" \
  "vgpu-manager's names: $(paste -sd' ' <<<"$links"))"
