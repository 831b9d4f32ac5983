//! Discovery against fake sysfs trees built in temporary directories.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

use vgpu_core::discovery::{
    DiscoveryConfig, DiscoveryError, DiscoveryWarning, Hypervisor, Platform, VendorTable, WarningEffect,
    discover, fields::FieldError,
};

const PCI_IDS: &str = "\
# test pci.ids
8086  Intel Corporation
\t1572  Ethernet Controller X710 for 10GbE SFP+
10de  NVIDIA Corporation
\t20b0  GA100 [A100 SXM4 40GB]
\t\t10de 134f  A100-SXM4-40GB
\t2330  GH100 [H100 SXM5 80GB]
9999  MetaX Integrated Circuits (Shanghai) Co., Ltd.
\t4001  MXC500
C 02  Network controller
\t00  Ethernet controller
C 03  Display controller
\t00  VGA compatible controller
\t02  3D controller
";

/// A fake sysfs root with a pci.ids file beside it.
struct FakeSys {
    dir: tempfile::TempDir,
}

/// One fake PCI device; `None` fields are not written.
#[derive(Default, Clone)]
struct Dev<'a> {
    vendor: Option<&'a str>,
    device: Option<&'a str>,
    class: Option<&'a str>,
    subsystem: Option<(&'a str, &'a str)>,
    numa: Option<&'a str>,
    driver: Option<&'a str>,
    iommu: Option<&'a str>,
}

impl FakeSys {
    fn new() -> Self {
        let fake = Self { dir: tempfile::tempdir().unwrap() };
        fs::create_dir_all(fake.devices_dir()).unwrap();
        fs::create_dir_all(fake.root().join("bus/pci/drivers")).unwrap();
        fs::create_dir_all(fake.root().join("kernel/iommu_groups")).unwrap();
        fs::write(fake.pci_ids(), PCI_IDS).unwrap();
        fake
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("sys")
    }

    fn devices_dir(&self) -> PathBuf {
        self.root().join("bus/pci/devices")
    }

    fn pci_ids(&self) -> PathBuf {
        self.dir.path().join("pci.ids")
    }

    fn config(&self) -> DiscoveryConfig {
        DiscoveryConfig::default().with_sysfs_root(self.root()).with_pci_ids_paths([self.pci_ids()])
    }

    /// Writes the device the way the kernel lays it out: a real directory under `devices/pci…`, linked from
    /// `bus/pci/devices/<address>`; returns the latter.
    fn add(&self, address: &str, dev: &Dev<'_>) -> PathBuf {
        let real = self.root().join("devices/pci0000:00").join(address);
        fs::create_dir_all(&real).unwrap();
        let write = |name: &str, value: Option<&str>| {
            if let Some(value) = value {
                fs::write(real.join(name), format!("{value}\n")).unwrap();
            }
        };
        write("vendor", dev.vendor);
        write("device", dev.device);
        write("class", dev.class);
        write("numa_node", dev.numa);
        if let Some((sv, sd)) = dev.subsystem {
            write("subsystem_vendor", Some(sv));
            write("subsystem_device", Some(sd));
        }
        if let Some(driver) = dev.driver {
            let target = self.root().join("bus/pci/drivers").join(driver);
            fs::create_dir_all(&target).unwrap();
            symlink(&target, real.join("driver")).unwrap();
        }
        if let Some(group) = dev.iommu {
            let target = self.root().join("kernel/iommu_groups").join(group);
            fs::create_dir_all(&target).unwrap();
            symlink(&target, real.join("iommu_group")).unwrap();
        }
        let link = self.devices_dir().join(address);
        symlink(&real, &link).unwrap();
        link
    }

    fn dmi(&self, vendor: &str, product: &str) {
        let dir = self.root().join("class/dmi/id");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("sys_vendor"), format!("{vendor}\n")).unwrap();
        fs::write(dir.join("product_name"), format!("{product}\n")).unwrap();
    }
}

fn gpu<'a>(vendor: &'a str, device: &'a str, numa: &'a str, driver: &'a str, iommu: &'a str) -> Dev<'a> {
    Dev {
        vendor: Some(vendor),
        device: Some(device),
        class: Some("0x030200"),
        numa: Some(numa),
        driver: Some(driver),
        iommu: Some(iommu),
        ..Dev::default()
    }
}

fn file_of(warning: &DiscoveryWarning) -> Option<&Path> {
    match warning {
        DiscoveryWarning::UnreadableFile { file, .. } | DiscoveryWarning::MalformedFile { file, .. } => {
            Some(file)
        }
        _ => None,
    }
}

#[test]
fn acceptance_two_nvidia_one_metax_one_nic() {
    let sys = FakeSys::new();
    sys.dmi("Supermicro", "SYS-821GE-TNHR");
    // Added out of order on purpose: the result is sorted by address.
    sys.add("0000:86:00.0", &gpu("0x9999", "0x4001", "1", "metax", "40"));
    sys.add(
        "0000:18:00.0",
        &Dev { subsystem: Some(("0x10de", "0x134f")), ..gpu("0x10de", "0x20b0", "0", "nvidia", "17") },
    );
    sys.add("0000:3b:00.0", &gpu("0x10de", "0x2330", "-1", "vfio-pci", "22"));
    sys.add(
        "0000:5e:00.0",
        &Dev {
            vendor: Some("0x8086"),
            device: Some("0x1572"),
            class: Some("0x020000"),
            numa: Some("0"),
            driver: Some("i40e"),
            ..Dev::default()
        },
    );

    let report = discover(&sys.config()).unwrap();
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert_eq!(report.platform, Platform::BareMetal);
    assert_eq!(report.pci_ids_path.as_deref(), Some(sys.pci_ids().as_path()));
    assert_eq!(report.gpus.len(), 3);

    let summary: Vec<_> = report
        .gpus
        .iter()
        .map(|g| {
            (
                g.index,
                g.address.to_string(),
                g.vendor.key.as_str(),
                g.vendor_name.as_str(),
                g.device_name.as_str(),
                g.numa_node,
                g.driver.as_deref(),
                g.iommu_group,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                0,
                "0000:18:00.0".to_owned(),
                "nvidia",
                "NVIDIA Corporation",
                "GA100 [A100 SXM4 40GB]",
                Some(0),
                Some("nvidia"),
                Some(17)
            ),
            (
                1,
                "0000:3b:00.0".to_owned(),
                "nvidia",
                "NVIDIA Corporation",
                "GH100 [H100 SXM5 80GB]",
                None,
                Some("vfio-pci"),
                Some(22)
            ),
            (
                2,
                "0000:86:00.0".to_owned(),
                "metax",
                "MetaX Integrated Circuits (Shanghai) Co., Ltd.",
                "MXC500",
                Some(1),
                Some("metax"),
                Some(40)
            ),
        ]
    );
    let a100 = &report.gpus[0];
    assert_eq!(a100.class_name, "3D controller");
    assert_eq!(a100.class_id(), 0x0302);
    assert_eq!(a100.model_slug(), "a100-sxm4-40gb");
    let sub = a100.subsystem.as_ref().unwrap();
    assert_eq!((sub.vendor_id, sub.device_id, sub.name.as_deref()), (0x10de, 0x134f, Some("A100-SXM4-40GB")));
    assert_eq!(report.gpus[2].model_slug(), "mxc500");
    assert!(report.gpus[1].subsystem.is_none());
}

#[test]
fn missing_database_gives_hex_names() {
    let sys = FakeSys::new();
    sys.add("0000:01:00.0", &Dev { class: Some("0x030000"), ..gpu("0x10de", "0x1eb8", "0", "nvidia", "1") });
    let config = sys.config().with_pci_ids_paths([sys.dir.path().join("nope.ids")]);
    let report = discover(&config).unwrap();
    let first = &report.gpus[0];
    assert_eq!(
        (first.vendor_name.as_str(), first.device_name.as_str(), first.class_name.as_str()),
        ("10de", "1eb8", "0300")
    );
    assert_eq!(report.pci_ids_path, None);
    assert!(matches!(report.warnings.as_slice(), [DiscoveryWarning::PciIdsMissing { .. }]));
    // Unknown ids in a present database fall back too.
    sys.add("0000:02:00.0", &gpu("0x10de", "0xffff", "0", "nvidia", "2"));
    let report = discover(&sys.config()).unwrap();
    assert_eq!(report.gpus[0].device_name, "1eb8");
    assert_eq!(report.gpus[1].device_name, "ffff");
}

#[test]
fn malformed_devices_are_warnings_and_do_not_hide_others() {
    let sys = FakeSys::new();
    let good = sys.add("0000:01:00.0", &gpu("0x10de", "0x2330", "0", "nvidia", "1"));
    let bad_vendor =
        sys.add("0000:02:00.0", &Dev { vendor: Some("nvidia"), ..gpu("", "0x2330", "0", "nvidia", "2") });
    let empty_class =
        sys.add("0000:03:00.0", &Dev { class: Some(""), ..gpu("0x10de", "0x2330", "0", "nvidia", "3") });
    let no_device =
        sys.add("0000:04:00.0", &Dev { device: None, ..gpu("0x10de", "0x2330", "0", "nvidia", "4") });
    let bad_numa = sys.add("0000:05:00.0", &gpu("0x10de", "0x2330", "zero", "nvidia", "5"));
    let bad_sub = sys.add(
        "0000:06:00.0",
        &Dev { subsystem: Some(("0x10de", "0xxyz")), ..gpu("0x10de", "0x2330", "0", "nvidia", "6") },
    );
    let bad_group = sys.add("0000:07:00.0", &gpu("0x10de", "0x2330", "0", "nvidia", "group-seven"));
    // A `driver` that is a plain file rather than a symlink.
    let bad_driver = sys.add("0000:08:00.0", &Dev { driver: None, ..gpu("0x10de", "0x2330", "0", "", "8") });
    fs::write(bad_driver.join("driver"), "nvidia\n").unwrap();
    // A numa_node that cannot be read (a directory).
    let dir_numa = sys.add("0000:09:00.0", &Dev { numa: None, ..gpu("0x10de", "0x2330", "", "nvidia", "9") });
    fs::create_dir(dir_numa.join("numa_node")).unwrap();
    // A non-GPU device with a malformed optional file: never read, so no warning.
    sys.add(
        "0000:0a:00.0",
        &Dev { class: Some("0x020000"), ..gpu("0x8086", "0x1572", "bogus", "i40e", "10") },
    );
    // Not a PCI address.
    fs::create_dir(sys.devices_dir().join("not-an-address")).unwrap();
    // An unbound GPU without NUMA or IOMMU information is fine.
    sys.add(
        "0000:0b:00.0",
        &Dev { vendor: Some("0x10de"), device: Some("0x2330"), class: Some("0x030200"), ..Dev::default() },
    );

    let report = discover(&sys.config()).unwrap();
    let addresses: Vec<String> = report.gpus.iter().map(|g| g.address.to_string()).collect();
    assert_eq!(
        addresses,
        [
            "0000:01:00.0",
            "0000:05:00.0",
            "0000:06:00.0",
            "0000:07:00.0",
            "0000:08:00.0",
            "0000:09:00.0",
            "0000:0b:00.0"
        ]
    );
    let indices: Vec<usize> = report.gpus.iter().map(|g| g.index).collect();
    assert_eq!(indices, (0..7).collect::<Vec<_>>());
    assert_eq!(report.gpus[0].sysfs_path, good);
    assert_eq!(report.gpus[1].numa_node, None);
    assert_eq!(report.gpus[2].subsystem, None);
    assert_eq!(report.gpus[3].iommu_group, None);
    assert_eq!(report.gpus[4].driver, None);
    assert_eq!(report.gpus[5].numa_node, None);
    let unbound = &report.gpus[6];
    assert_eq!((unbound.driver.as_deref(), unbound.numa_node, unbound.iommu_group), (None, None, None));

    let expect = |file: PathBuf, effect: WarningEffect| {
        let warning = report
            .warnings
            .iter()
            .find(|w| file_of(w) == Some(file.as_path()))
            .unwrap_or_else(|| panic!("no warning for {}: {:?}", file.display(), report.warnings));
        match warning {
            DiscoveryWarning::UnreadableFile { effect: e, .. }
            | DiscoveryWarning::MalformedFile { effect: e, .. } => {
                assert_eq!(*e, effect, "{warning}")
            }
            _ => unreachable!(),
        }
        warning.to_string()
    };
    let message = expect(bad_vendor.join("vendor"), WarningEffect::DeviceSkipped);
    assert!(message.contains("hexadecimal 16-bit id") && message.contains("\"nvidia\""), "{message}");
    let message = expect(empty_class.join("class"), WarningEffect::DeviceSkipped);
    assert!(message.contains("empty"), "{message}");
    let message = expect(no_device.join("device"), WarningEffect::DeviceSkipped);
    assert!(message.contains("does not exist"), "{message}");
    let message = expect(bad_numa.join("numa_node"), WarningEffect::FieldIgnored);
    assert!(message.contains("NUMA node number or -1"), "{message}");
    expect(bad_sub.join("subsystem_device"), WarningEffect::FieldIgnored);
    let message = expect(bad_group.join("iommu_group"), WarningEffect::FieldIgnored);
    assert!(message.contains("IOMMU group"), "{message}");
    expect(bad_driver.join("driver"), WarningEffect::FieldIgnored);
    expect(dir_numa.join("numa_node"), WarningEffect::FieldIgnored);
    assert!(report.warnings.iter().any(|w| matches!(w, DiscoveryWarning::BadAddress { .. })));
    assert_eq!(report.warnings.len(), 9, "{:#?}", report.warnings);
    assert!(report.warnings.iter().any(|w| matches!(
        w,
        DiscoveryWarning::MalformedFile { error: FieldError::Invalid { found, .. }, .. } if found == "nvidia"
    )));
}

#[test]
fn fatal_error_when_bus_is_missing_and_vm_when_dmi_is() {
    let dir = tempfile::tempdir().unwrap();
    let config = DiscoveryConfig::default().with_sysfs_root(dir.path());
    let err = discover(&config).unwrap_err();
    assert!(matches!(err, DiscoveryError::ScanDirectory { .. }));
    assert!(err.to_string().contains("bus/pci/devices"), "{err}");

    let sys = FakeSys::new();
    assert_eq!(discover(&sys.config()).unwrap().platform, Platform::VirtualMachine(None));
    sys.dmi("QEMU", "Standard PC (Q35 + ICH9, 2009)");
    assert_eq!(discover(&sys.config()).unwrap().platform, Platform::VirtualMachine(Some(Hypervisor::Qemu)));
}

#[test]
fn vendor_file_extends_and_restricts() {
    let sys = FakeSys::new();
    sys.add("0000:01:00.0", &gpu("0x10de", "0x2330", "0", "nvidia", "1"));
    sys.add("0000:02:00.0", &gpu("0x1002", "0x74a1", "0", "amdgpu", "2"));
    sys.add("0000:03:00.0", &gpu("0x9999", "0x4001", "0", "metax", "3"));
    assert_eq!(discover(&sys.config()).unwrap().gpus.len(), 2);

    let file = sys.dir.path().join("vendors.yaml");
    fs::write(
        &file,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: gpu-supported-vendors\ndata:\n  vendors.yaml: |\n    vendors:\n      - id: \"1002\"\n        name: amd\n      - id: \"9999\"\n        enabled: false\n",
    )
    .unwrap();
    let config = sys.config().with_vendors_file(&file).unwrap();
    let report = discover(&config).unwrap();
    let keys: Vec<&str> = report.gpus.iter().map(|g| g.vendor.key.as_str()).collect();
    assert_eq!(keys, ["nvidia", "amd"]);
    assert_eq!(report.gpus[1].device_name, "74a1");

    let none = discover(&sys.config().with_vendors(VendorTable::empty())).unwrap();
    assert!(none.gpus.is_empty());
}

#[test]
fn malformed_pci_ids_is_a_warning() {
    let sys = FakeSys::new();
    sys.add("0000:01:00.0", &gpu("0x10de", "0x2330", "0", "nvidia", "1"));
    fs::write(sys.pci_ids(), "10de  NVIDIA Corporation\n\tgggg  broken\n\t2330  H100\n!!\n").unwrap();
    let report = discover(&sys.config()).unwrap();
    assert_eq!(report.gpus[0].device_name, "H100");
    match report.warnings.as_slice() {
        [DiscoveryWarning::PciIdsMalformed { count: 2, first_line: 2, .. }] => {}
        other => panic!("{other:?}"),
    }
}

mod arbitrary_files {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the attribute files hold, discovery returns (never panics), and a device is either reported
        /// with the ids it was given or explained by a warning.
        #[test]
        fn discovery_never_panics(
            vendor in prop_oneof![Just("0x10de".to_owned()), any::<String>()],
            device in any::<String>(),
            class in prop_oneof![Just("0x030200".to_owned()), any::<String>()],
            numa in any::<String>(),
            sub in any::<String>(),
        ) {
            let sys = FakeSys::new();
            let dir = sys.add("0000:01:00.0", &Dev::default());
            for (name, value) in [("vendor", &vendor), ("device", &device), ("class", &class), ("numa_node", &numa), ("subsystem_vendor", &sub), ("subsystem_device", &sub)] {
                fs::write(dir.join(name), value).unwrap();
            }
            let report = discover(&sys.config()).unwrap();
            prop_assert!(report.gpus.len() <= 1);
            if let Some(gpu) = report.gpus.first() {
                prop_assert_eq!(gpu.vendor_id, 0x10de);
                prop_assert_eq!(gpu.class_code >> 16, 0x03);
            }
        }
    }
}
