//! The MetaX backend on fake sysfs trees, without and with a stub `libmxsml.so` built from C here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use vgpu_core::backend::{BackendKind, DeviceBackend, MigMode};
use vgpu_nvml::{
    BackendChoice, MetaxBackend, MetaxOptions, SelectOptions, open_backend, select::detect_backend,
};

/// A PCI device directory with the given attributes.
fn pci_device(root: &Path, address: &str, vendor: &str, class: &str, numa: &str, drm: &[&str]) {
    let dir = root.join("sys/bus/pci/devices").join(address);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
    std::fs::write(dir.join("device"), "0x4000\n").unwrap();
    std::fs::write(dir.join("class"), format!("{class}\n")).unwrap();
    std::fs::write(dir.join("numa_node"), format!("{numa}\n")).unwrap();
    for name in drm {
        std::fs::create_dir_all(dir.join("drm").join(name)).unwrap();
        std::fs::create_dir_all(root.join("dev/dri")).unwrap();
        std::fs::write(root.join("dev/dri").join(name), "").unwrap();
    }
}

/// Two MetaX GPUs on NUMA 0 and 1, a NIC, and `/dev/mxcd`.
fn metax_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    pci_device(root, "0000:3b:00.0", "0x9999", "0x030000", "0", &["card1", "renderD129"]);
    pci_device(root, "0000:86:00.0", "0x9999", "0x038000", "1", &["card2", "renderD130"]);
    pci_device(root, "0000:17:00.0", "0x15b3", "0x020000", "0", &[]);
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::write(root.join("dev/mxcd"), "").unwrap();
    dir
}

fn options(root: &Path) -> MetaxOptions {
    MetaxOptions {
        sysfs_root: root.join("sys"),
        dev_root: root.join("dev"),
        library_path: None,
        library_dirs: vec![root.join("opt/mxdriver/lib")],
        pci_ids_paths: Vec::new(),
    }
}

const STUB: &str = r#"
#include <stdio.h>
#include <string.h>
typedef struct { unsigned int deviceId; unsigned int type; char bdfId[32]; unsigned int gpuId; unsigned int nodeId;
                 char uuid[96]; unsigned int brand; unsigned int mode; char deviceName[32]; } info_t;
typedef struct { long visVramTotal, visVramUse, vramTotal, vramUse, xttTotal, xttUse; } mem_t;
static int ready = 0;
static const char *bdf[] = { "0000:86:00.0", "0000:3b:00.0" };
unsigned int mxSmlInit(void) { ready = 1; return 0; }
unsigned int mxSmlGetDeviceCount(void) { return ready ? 2 : 0; }
unsigned int mxSmlGetDeviceInfo(unsigned int id, info_t *info) {
    if (id >= 2) return 6;
    memset(info, 0, sizeof *info);
    info->deviceId = id;
    strcpy(info->bdfId, bdf[id]);
    snprintf(info->uuid, sizeof info->uuid, "GPU-5e7a0000-0000-4000-8000-00000000000%u", id);
    strcpy(info->deviceName, "MetaX C500");
    return 0;
}
unsigned int mxSmlGetMemoryInfo(unsigned int id, mem_t *m) {
    if (id >= 2) return 6;
    memset(m, 0, sizeof *m);
    m->vramTotal = 67108864L; /* 64 GiB in KiB */
    m->vramUse = 1048576L * (id + 1);
    return 0;
}
unsigned int mxSmlGetDeviceIpUsage(unsigned int id, unsigned int ip, int *usage) {
    if (id >= 2) return 6;
    *usage = ip == 4 ? 37 + (int)id : 0;
    return 0;
}
unsigned int mxSmlGetDeviceTopology(unsigned int a, unsigned int b, unsigned int *level) {
    if (a >= 2 || b >= 2) return 6;
    *level = 5; /* MXSML_TOPOLOGY_METAXLINK */
    return 0;
}
"#;

/// Builds the stub library into `dir/libmxsml.so` with the first C compiler found (`cc`, `gcc`, `clang`).
///
/// No compiler is a failure with the reason, never a silent pass: the library path of the MetaX backend is
/// only tested through this stub. Install one (Debian: `apt-get install gcc`) to run the test.
fn build_stub(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let source = dir.join("stub.c");
    std::fs::write(&source, STUB).unwrap();
    let library = dir.join("libmxsml.so");
    for compiler in ["cc", "gcc", "clang"] {
        match Command::new(compiler).arg("-shared").arg("-fPIC").arg("-o").arg(&library).arg(&source).status()
        {
            Ok(status) if status.success() => return library,
            Ok(status) => panic!("{compiler} failed to build the libmxsml.so stub: {status}"),
            Err(_) => continue,
        }
    }
    panic!(
        "no C compiler (cc, gcc or clang) on PATH to build the libmxsml.so stub this test loads; install one \
         (Debian: apt-get install gcc)"
    )
}

#[test]
fn lists_devices_from_sysfs_without_the_library() {
    let tree = metax_tree();
    let backend = MetaxBackend::new(options(tree.path())).unwrap();
    let devices = backend.devices().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0].bus_id, "0000:3b:00.0");
    assert_eq!(devices[0].uuid, "METAX-0000:3b:00.0");
    assert_eq!(devices[0].type_name, "4000");
    assert_eq!((devices[0].numa_node, devices[1].numa_node), (Some(0), Some(1)));
    assert_eq!(devices[1].memory_mib, 0);
    assert!(
        backend.warnings().iter().any(|w| w.contains("libmxsml.so not found")),
        "{:?}",
        backend.warnings()
    );
    let nodes = backend.device_nodes(1).unwrap();
    assert_eq!(
        nodes,
        &[
            tree.path().join("dev/mxcd"),
            tree.path().join("dev/dri/card2"),
            tree.path().join("dev/dri/renderD130")
        ]
    );
    // Without the library: NUMA-based links, no memory, no utilisation, no MIG.
    assert_eq!(backend.topology().unwrap().links(0, 1), &[1]);
    assert!(backend.memory_usage(0).is_err());
    assert!(backend.utilization(0).is_err());
    assert_eq!(backend.mig_layout(0).unwrap().mode, MigMode::NotSupported);
    assert!(backend.device_nodes(2).is_err());
}

#[test]
fn warns_about_missing_device_nodes() {
    let tree = metax_tree();
    std::fs::remove_file(tree.path().join("dev/mxcd")).unwrap();
    std::fs::remove_file(tree.path().join("dev/dri/card1")).unwrap();
    std::fs::remove_file(tree.path().join("dev/dri/renderD129")).unwrap();
    let backend = MetaxBackend::new(options(tree.path())).unwrap();
    let warnings = backend.warnings().join("\n");
    assert!(warnings.contains("mxcd does not exist"), "{warnings}");
    assert!(warnings.contains("0000:3b:00.0: no DRM device node"), "{warnings}");
    assert!(backend.device_nodes(0).unwrap().is_empty());
}

#[test]
fn reads_the_management_library() {
    let tree = metax_tree();
    let _library = build_stub(&tree.path().join("opt/mxdriver/lib"));
    let backend = MetaxBackend::new(options(tree.path())).unwrap();
    assert!(backend.library_path().is_some(), "{:?}", backend.warnings());
    let devices = backend.devices().unwrap();
    // The library lists the GPUs in another order; they are matched by PCI address.
    assert_eq!(devices[0].uuid, "GPU-5e7a0000-0000-4000-8000-000000000001");
    assert_eq!(devices[1].uuid, "GPU-5e7a0000-0000-4000-8000-000000000000");
    assert_eq!(devices[0].type_name, "MetaX C500");
    assert_eq!(devices[0].memory_mib, 65536);
    let usage = backend.memory_usage(0).unwrap();
    assert_eq!((usage.total_bytes, usage.used_bytes), (64 << 30, 2 << 30));
    assert_eq!(backend.utilization(0).unwrap(), 38);
    assert_eq!(backend.utilization(1).unwrap(), 37);
    assert_eq!(backend.topology().unwrap().links(0, 1), &[7]);
    assert!(!backend.warnings().iter().any(|w| w.contains("not found")), "{:?}", backend.warnings());
}

#[test]
fn an_explicit_bad_library_is_an_error() {
    let tree = metax_tree();
    let bad = tree.path().join("libmxsml.so");
    std::fs::write(&bad, "not an ELF file").unwrap();
    let mut options = options(tree.path());
    options.library_path = Some(bad.clone());
    let err = MetaxBackend::new(options.clone()).unwrap_err().to_string();
    assert!(err.starts_with(&format!("cannot use the MetaX management library {}", bad.display())), "{err}");
    // Found by search instead: only a warning.
    options.library_path = None;
    options.library_dirs = vec![tree.path().to_path_buf()];
    let backend = MetaxBackend::new(options).unwrap();
    assert!(backend.warnings().iter().any(|w| w.starts_with("cannot use")), "{:?}", backend.warnings());
    assert_eq!(backend.devices().unwrap().len(), 2);
}

#[test]
fn auto_picks_by_vendor() {
    let tree = metax_tree();
    let sys = tree.path().join("sys");
    assert_eq!(detect_backend(&sys).unwrap(), BackendKind::MetaX);
    let mut select = SelectOptions::default().with_sysfs_root(&sys);
    select.metax = options(tree.path());
    let opened = open_backend(BackendChoice::Auto, &select).unwrap();
    assert_eq!((opened.kind, opened.backend.name()), (BackendKind::MetaX, "metax"));
    assert!(!opened.warnings.is_empty());

    pci_device(tree.path(), "0000:01:00.0", "0x10de", "0x030200", "0", &[]);
    assert_eq!(detect_backend(&sys).unwrap(), BackendKind::Nvml);

    let empty = tempfile::tempdir().unwrap();
    pci_device(empty.path(), "0000:17:00.0", "0x15b3", "0x020000", "0", &[]);
    let err = detect_backend(&empty.path().join("sys")).unwrap_err().to_string();
    assert!(err.starts_with("no NVIDIA (10de) or MetaX (9999) GPU found under"), "{err}");
}
