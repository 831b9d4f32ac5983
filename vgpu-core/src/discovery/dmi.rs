//! Bare metal or virtual machine, from DMI (`<sysfs-root>/class/dmi/id/*`).
//!
//! The decision fails closed: when DMI cannot be read at all the host is taken to be a virtual machine, so that
//! features that need bare metal (VFIO passthrough of a whole card) stay off.

use std::{fmt, path::Path};

/// A hypervisor or cloud recognised from DMI strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Hypervisor {
    /// QEMU without KVM markers (also "Standard PC (Q35 + ICH9)" machines).
    Qemu,
    /// KVM.
    Kvm,
    /// VMware.
    VMware,
    /// Oracle VirtualBox (`innotek GmbH`).
    VirtualBox,
    /// Xen (including older Xen-based EC2 instances).
    Xen,
    /// Microsoft Hyper-V (and Azure).
    HyperV,
    /// Amazon EC2 (Nitro); `*.metal` instance types are bare metal.
    AmazonEc2,
    /// Google Compute Engine.
    Google,
    /// OpenStack Nova.
    OpenStack,
    /// Bochs.
    Bochs,
    /// Parallels.
    Parallels,
    /// FreeBSD bhyve.
    Bhyve,
    /// Alibaba Cloud ECS.
    AlibabaCloud,
}

impl fmt::Display for Hypervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Qemu => "QEMU",
            Self::Kvm => "KVM",
            Self::VMware => "VMware",
            Self::VirtualBox => "VirtualBox",
            Self::Xen => "Xen",
            Self::HyperV => "Microsoft Hyper-V",
            Self::AmazonEc2 => "Amazon EC2",
            Self::Google => "Google Compute Engine",
            Self::OpenStack => "OpenStack",
            Self::Bochs => "Bochs",
            Self::Parallels => "Parallels",
            Self::Bhyve => "bhyve",
            Self::AlibabaCloud => "Alibaba Cloud",
        })
    }
}

/// What the host is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    /// A physical machine.
    BareMetal,
    /// A virtual machine; `None` when DMI was unreadable (fail-closed) rather than recognised.
    VirtualMachine(Option<Hypervisor>),
}

impl Platform {
    /// Whether the host is a physical machine.
    pub fn is_bare_metal(&self) -> bool {
        matches!(self, Self::BareMetal)
    }
}

/// The DMI strings used to classify the host (each trimmed; `None` when unreadable or empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DmiInfo {
    /// `sys_vendor`.
    pub sys_vendor: Option<String>,
    /// `product_name`.
    pub product_name: Option<String>,
    /// `product_version`.
    pub product_version: Option<String>,
    /// `board_vendor`.
    pub board_vendor: Option<String>,
    /// `bios_vendor`.
    pub bios_vendor: Option<String>,
    /// `bios_version`.
    pub bios_version: Option<String>,
}

fn read_dmi_string(dir: &Path, name: &str) -> Option<String> {
    let bytes = std::fs::read(dir.join(name)).ok()?;
    let text = String::from_utf8_lossy(bytes.get(..bytes.len().min(1024))?).trim().to_owned();
    (!text.is_empty()).then_some(text)
}

impl DmiInfo {
    /// Reads `<sysfs_root>/class/dmi/id/{sys_vendor,product_name,...}`. Unreadable files are left `None`.
    pub fn read(sysfs_root: &Path) -> Self {
        let dir = sysfs_root.join("class/dmi/id");
        Self {
            sys_vendor: read_dmi_string(&dir, "sys_vendor"),
            product_name: read_dmi_string(&dir, "product_name"),
            product_version: read_dmi_string(&dir, "product_version"),
            board_vendor: read_dmi_string(&dir, "board_vendor"),
            bios_vendor: read_dmi_string(&dir, "bios_vendor"),
            bios_version: read_dmi_string(&dir, "bios_version"),
        }
    }

    /// Classifies the host. Without `sys_vendor` and `product_name` it is a VM of unknown kind (fail-closed).
    ///
    /// ```
    /// use vgpu_core::discovery::dmi::{DmiInfo, Hypervisor, Platform};
    ///
    /// let dmi = DmiInfo { sys_vendor: Some("QEMU".into()), product_name: Some("Standard PC (Q35 + ICH9, 2009)".into()), ..Default::default() };
    /// assert_eq!(dmi.classify(), Platform::VirtualMachine(Some(Hypervisor::Qemu)));
    /// assert_eq!(DmiInfo::default().classify(), Platform::VirtualMachine(None));
    /// ```
    pub fn classify(&self) -> Platform {
        if self.sys_vendor.is_none() && self.product_name.is_none() {
            return Platform::VirtualMachine(None);
        }
        let lower = |v: &Option<String>| v.as_deref().unwrap_or("").to_ascii_lowercase();
        let vendor = lower(&self.sys_vendor);
        let product = lower(&self.product_name);
        let version = lower(&self.product_version);
        let board = lower(&self.board_vendor);
        let bios = lower(&self.bios_vendor);
        let bios_version = lower(&self.bios_version);
        let any = |needle: &str| {
            [&vendor, &product, &version, &board, &bios, &bios_version].iter().any(|s| s.contains(needle))
        };

        // Amazon: Nitro VMs and bare-metal instances share the vendor; the product names the instance type.
        if vendor.contains("amazon ec2") {
            return if product.ends_with(".metal") || product.contains(".metal-") {
                Platform::BareMetal
            } else {
                Platform::VirtualMachine(Some(Hypervisor::AmazonEc2))
            };
        }
        // Microsoft also sells hardware: only its virtual machine product name means Hyper-V.
        if vendor.contains("microsoft") && product.contains("virtual machine") {
            return Platform::VirtualMachine(Some(Hypervisor::HyperV));
        }
        let rules: [(&str, Hypervisor); 12] = [
            ("google", Hypervisor::Google),
            ("openstack", Hypervisor::OpenStack),
            ("alibaba cloud", Hypervisor::AlibabaCloud),
            ("vmware", Hypervisor::VMware),
            ("innotek", Hypervisor::VirtualBox),
            ("virtualbox", Hypervisor::VirtualBox),
            ("xen", Hypervisor::Xen),
            ("parallels", Hypervisor::Parallels),
            ("bhyve", Hypervisor::Bhyve),
            ("bochs", Hypervisor::Bochs),
            ("kvm", Hypervisor::Kvm),
            ("qemu", Hypervisor::Qemu),
        ];
        for (needle, hypervisor) in rules {
            let hit = if needle == "google" {
                // "Google" alone is also a vendor of physical machines (Chromebooks); require Compute Engine.
                vendor.contains("google") && product.contains("compute engine")
            } else {
                any(needle)
            };
            if hit {
                return Platform::VirtualMachine(Some(hypervisor));
            }
        }
        Platform::BareMetal
    }
}

/// Reads DMI under `sysfs_root` and classifies the host.
pub fn detect_platform(sysfs_root: &Path) -> Platform {
    DmiInfo::read(sysfs_root).classify()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dmi(vendor: &str, product: &str) -> DmiInfo {
        DmiInfo { sys_vendor: Some(vendor.into()), product_name: Some(product.into()), ..Default::default() }
    }

    #[test]
    fn recognises_hypervisors() {
        let vm = |h| Platform::VirtualMachine(Some(h));
        assert_eq!(dmi("QEMU", "Standard PC (i440FX + PIIX, 1996)").classify(), vm(Hypervisor::Qemu));
        assert_eq!(dmi("Red Hat", "KVM").classify(), vm(Hypervisor::Kvm));
        assert_eq!(dmi("VMware, Inc.", "VMware Virtual Platform").classify(), vm(Hypervisor::VMware));
        assert_eq!(dmi("innotek GmbH", "VirtualBox").classify(), vm(Hypervisor::VirtualBox));
        assert_eq!(dmi("Xen", "HVM domU").classify(), vm(Hypervisor::Xen));
        assert_eq!(dmi("Microsoft Corporation", "Virtual Machine").classify(), vm(Hypervisor::HyperV));
        assert_eq!(dmi("Amazon EC2", "p4d.24xlarge").classify(), vm(Hypervisor::AmazonEc2));
        assert_eq!(dmi("Google", "Google Compute Engine").classify(), vm(Hypervisor::Google));
        assert_eq!(dmi("OpenStack Foundation", "OpenStack Nova").classify(), vm(Hypervisor::OpenStack));
        assert_eq!(dmi("Alibaba Cloud", "Alibaba Cloud ECS").classify(), vm(Hypervisor::AlibabaCloud));
        let bochs = DmiInfo { bios_vendor: Some("Bochs".into()), ..dmi("Bochs", "Bochs") };
        assert_eq!(bochs.classify(), vm(Hypervisor::Bochs));
    }

    #[test]
    fn recognises_bare_metal() {
        assert_eq!(dmi("Supermicro", "SYS-4029GP-TRT").classify(), Platform::BareMetal);
        assert_eq!(dmi("NVIDIA", "DGXH100").classify(), Platform::BareMetal);
        assert_eq!(dmi("Amazon EC2", "p5.48xlarge.metal").classify(), Platform::BareMetal);
        assert_eq!(dmi("Amazon EC2", "m7i.metal-24xl").classify(), Platform::BareMetal);
        assert_eq!(dmi("Microsoft Corporation", "Surface Pro").classify(), Platform::BareMetal);
        assert_eq!(dmi("Google", "Eve").classify(), Platform::BareMetal);
        let only_vendor = DmiInfo { sys_vendor: Some("Dell Inc.".into()), ..Default::default() };
        assert!(only_vendor.classify().is_bare_metal());
    }

    #[test]
    fn reads_files_and_fails_closed() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(detect_platform(root.path()), Platform::VirtualMachine(None));
        let dir = root.path().join("class/dmi/id");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("sys_vendor"), "  \n").unwrap();
        assert_eq!(detect_platform(root.path()), Platform::VirtualMachine(None));
        std::fs::write(dir.join("sys_vendor"), "Dell Inc.\n").unwrap();
        std::fs::write(dir.join("product_name"), "PowerEdge XE9680\n").unwrap();
        assert_eq!(detect_platform(root.path()), Platform::BareMetal);
        std::fs::write(dir.join("bios_vendor"), "SeaBIOS\n").unwrap();
        std::fs::write(dir.join("product_version"), "pc-q35-8.2\n").unwrap();
        std::fs::write(dir.join("sys_vendor"), "QEMU\n").unwrap();
        assert_eq!(detect_platform(root.path()), Platform::VirtualMachine(Some(Hypervisor::Qemu)));
    }
}
