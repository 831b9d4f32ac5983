//! A fake sysfs tree for tests, benches, e2e and demos: PCI devices laid out as the kernel does
//! (`devices/pci0000:00/<address>/{vendor,device,class,numa_node,driver→,iommu_group→}`, linked from
//! `bus/pci/devices/<address>`), plus a small `pci.ids` naming NVIDIA A100/H100, MetaX MXC500 and an Intel
//! NIC.
//!
//! ```
//! use vgpu_node_agent::fake_sysfs::{FakeDevice, FakeSysfs};
//!
//! let dir = tempfile::tempdir()?;
//! let sys = FakeSysfs::create(dir.path())?;
//! sys.add("0000:3b:00.0", &FakeDevice::gpu("10de", "20b0", "nvidia"))?;
//! assert!(sys.sysfs_root().join("bus/pci/devices/0000:3b:00.0/vendor").exists());
//! sys.remove("0000:3b:00.0")?;
//! assert!(!sys.sysfs_root().join("bus/pci/devices/0000:3b:00.0").exists());
//! # Ok::<(), std::io::Error>(())
//! ```

use std::{
    fs, io,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

/// The `pci.ids` text written beside the tree.
pub const PCI_IDS: &str = "\
# vgpu-node-agent fake pci.ids
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

/// One fake PCI device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeDevice {
    /// `vendor`, hex without `0x`.
    pub vendor: String,
    /// `device`, hex without `0x`.
    pub device: String,
    /// `class`, hex without `0x` (`030200`).
    pub class: String,
    /// The bound driver, if any.
    pub driver: Option<String>,
    /// `numa_node`.
    pub numa_node: i32,
}

impl FakeDevice {
    /// A 3D controller of `vendor`/`device` bound to `driver`.
    pub fn gpu(vendor: &str, device: &str, driver: &str) -> Self {
        Self {
            vendor: vendor.to_owned(),
            device: device.to_owned(),
            class: "030200".to_owned(),
            driver: Some(driver.to_owned()),
            numa_node: 0,
        }
    }

    /// An Intel X710 Ethernet controller (class `020000`), which is never a GPU.
    pub fn nic() -> Self {
        Self {
            vendor: "8086".to_owned(),
            device: "1572".to_owned(),
            class: "020000".to_owned(),
            driver: Some("i40e".to_owned()),
            numa_node: 0,
        }
    }
}

/// A fake sysfs root at `<dir>/sys` with `<dir>/pci.ids`.
#[derive(Debug, Clone)]
pub struct FakeSysfs {
    dir: PathBuf,
}

impl FakeSysfs {
    /// Creates the empty tree and `pci.ids` under `dir`.
    pub fn create(dir: &Path) -> io::Result<Self> {
        let fake = Self { dir: dir.to_path_buf() };
        fs::create_dir_all(fake.sysfs_root().join("bus/pci/devices"))?;
        fs::create_dir_all(fake.sysfs_root().join("bus/pci/drivers"))?;
        fs::write(fake.pci_ids(), PCI_IDS)?;
        Ok(fake)
    }

    /// The sysfs root to scan.
    pub fn sysfs_root(&self) -> PathBuf {
        self.dir.join("sys")
    }

    /// The `pci.ids` path.
    pub fn pci_ids(&self) -> PathBuf {
        self.dir.join("pci.ids")
    }

    /// Adds a device at `address` (`0000:3b:00.0`).
    pub fn add(&self, address: &str, device: &FakeDevice) -> io::Result<()> {
        let real = self.sysfs_root().join("devices/pci0000:00").join(address);
        fs::create_dir_all(&real)?;
        fs::write(real.join("vendor"), format!("0x{}\n", device.vendor))?;
        fs::write(real.join("device"), format!("0x{}\n", device.device))?;
        fs::write(real.join("class"), format!("0x{}\n", device.class))?;
        fs::write(real.join("numa_node"), format!("{}\n", device.numa_node))?;
        if let Some(driver) = &device.driver {
            let target = self.sysfs_root().join("bus/pci/drivers").join(driver);
            fs::create_dir_all(&target)?;
            symlink(&target, real.join("driver"))?;
        }
        symlink(&real, self.sysfs_root().join("bus/pci/devices").join(address))
    }

    /// Removes the device at `address`, as a hot-unplug does.
    pub fn remove(&self, address: &str) -> io::Result<()> {
        fs::remove_file(self.sysfs_root().join("bus/pci/devices").join(address))?;
        fs::remove_dir_all(self.sysfs_root().join("devices/pci0000:00").join(address))
    }

    /// The acceptance layout: NVIDIA A100 at `0000:3b:00.0` and `0000:86:00.0`, MetaX MXC500 at
    /// `0000:5e:00.0`, Intel NIC at `0000:18:00.0`.
    pub fn two_nvidia_one_metax_one_nic(&self) -> io::Result<()> {
        self.add("0000:18:00.0", &FakeDevice::nic())?;
        self.add("0000:3b:00.0", &FakeDevice::gpu("10de", "20b0", "nvidia"))?;
        self.add("0000:5e:00.0", &FakeDevice::gpu("9999", "4001", "metax"))?;
        self.add("0000:86:00.0", &FakeDevice::gpu("10de", "20b0", "nvidia"))
    }
}
