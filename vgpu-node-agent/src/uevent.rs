//! PCI hot-plug events from the kernel (udev's source: a `NETLINK_KOBJECT_UEVENT` socket, multicast group 1),
//! so that a GPU that appears or leaves is scanned at once instead of at the next period.
//!
//! | part | what |
//! |---|---|
//! | [`Uevent::parse`] | one kernel message: `ACTION@DEVPATH\0KEY=VALUE\0…` (messages re-broadcast by udevd, which start with `libudev`, are not read: the group-1 socket only receives the kernel's) |
//! | [`Uevent::is_pci_change`] | `SUBSYSTEM=pci` and an action that changes what sysfs shows: `add`, `remove`, `bind`, `unbind`, `change`, `move` |
//! | [`PciEvents`] | the socket (close-on-exec, 1 s receive timeout) read by a dedicated thread that forwards PCI events to a channel; `next` awaits the next one; the thread ends within a second of the [`PciEvents`] being dropped |
//!
//! Where the socket cannot be opened (no netlink in a sandbox, seccomp), [`PciEvents::open`] fails with the
//! reason and the agent keeps scanning on its period only; it says so once in its log.

use std::{collections::BTreeMap, io, os::fd::OwnedFd, time::Duration};

use rustix::net::{
    AddressFamily, RecvFlags, SocketFlags, SocketType,
    netlink::{self, SocketAddrNetlink},
    sockopt::{self, Timeout},
};
use tokio::sync::mpsc;

/// One kernel uevent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uevent {
    /// `ACTION` (`add`, `remove`, `bind`, …).
    pub action: String,
    /// `DEVPATH` below `/sys` (`/devices/pci0000:00/0000:00:04.0`).
    pub devpath: String,
    /// Every `KEY=VALUE` of the message (`SUBSYSTEM`, `PCI_ID`, `DRIVER`, …).
    pub env: BTreeMap<String, String>,
}

impl Uevent {
    /// Parses one message; `None` for anything that is not a kernel uevent (no `@` header, udev's
    /// `libudev` messages, no `ACTION`).
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let mut fields = bytes.split(|b| *b == 0).filter(|f| !f.is_empty());
        let header = std::str::from_utf8(fields.next()?).ok()?;
        let (header_action, header_path) = header.split_once('@')?;
        let mut env = BTreeMap::new();
        for field in fields {
            let Ok(text) = std::str::from_utf8(field) else { continue };
            if let Some((key, value)) = text.split_once('=') {
                env.insert(key.to_owned(), value.to_owned());
            }
        }
        let action = env.get("ACTION").cloned().unwrap_or_else(|| header_action.to_owned());
        let devpath = env.get("DEVPATH").cloned().unwrap_or_else(|| header_path.to_owned());
        if action.is_empty() {
            return None;
        }
        Some(Self { action, devpath, env })
    }

    /// Whether the event may change the PCI devices a scan finds.
    pub fn is_pci_change(&self) -> bool {
        self.env.get("SUBSYSTEM").is_some_and(|s| s == "pci")
            && matches!(self.action.as_str(), "add" | "remove" | "bind" | "unbind" | "change" | "move")
    }
}

/// The kernel's uevents, filtered to PCI changes.
#[derive(Debug)]
pub struct PciEvents {
    rx: mpsc::Receiver<io::Result<Uevent>>,
}

/// How long the reader thread blocks in one `recv` before it checks whether anyone still listens.
const RECV_TIMEOUT: Duration = Duration::from_secs(1);

impl PciEvents {
    /// Opens and binds the uevent socket (multicast group 1, the kernel's events) and starts its reader
    /// thread.
    pub fn open() -> io::Result<Self> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            Some(netlink::KOBJECT_UEVENT),
        )?;
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, 1))?;
        sockopt::set_socket_timeout(&fd, Timeout::Recv, Some(RECV_TIMEOUT))?;
        let (tx, rx) = mpsc::channel(64);
        std::thread::Builder::new().name("pci-uevents".into()).spawn(move || read_loop(&fd, &tx))?;
        Ok(Self { rx })
    }

    /// Waits for the next PCI event; an error when the socket failed (the reader thread has stopped).
    pub async fn next(&mut self) -> io::Result<Uevent> {
        match self.rx.recv().await {
            Some(event) => event,
            None => Err(io::Error::other("the uevent reader stopped")),
        }
    }
}

/// Reads messages until the receiver is gone or the socket fails, forwarding PCI changes.
fn read_loop(fd: &OwnedFd, tx: &mpsc::Sender<io::Result<Uevent>>) {
    let mut buf = vec![0u8; 64 * 1024];
    while !tx.is_closed() {
        match rustix::net::recv(fd, &mut buf[..], RecvFlags::empty()) {
            Ok((n, _)) => {
                if let Some(event) = buf.get(..n).and_then(Uevent::parse)
                    && event.is_pci_change()
                    && tx.blocking_send(Ok(event)).is_err()
                {
                    return;
                }
            }
            Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR => {}
            // ENOBUFS: the kernel dropped messages because we were slow; the next scan sees the state anyway.
            Err(e) if e == rustix::io::Errno::NOBUFS => {}
            Err(e) => {
                let _ = tx.blocking_send(Err(io::Error::from(e)));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use proptest::prelude::*;

    use super::*;

    fn message(parts: &[&str]) -> Vec<u8> {
        parts.iter().flat_map(|p| p.bytes().chain([0])).collect()
    }

    #[test]
    fn parses_a_kernel_pci_add() {
        let m = message(&[
            "add@/devices/pci0000:00/0000:00:04.0",
            "ACTION=add",
            "DEVPATH=/devices/pci0000:00/0000:00:04.0",
            "SUBSYSTEM=pci",
            "PCI_ID=10DE:20B0",
            "PCI_SLOT_NAME=0000:00:04.0",
            "SEQNUM=4242",
        ]);
        let e = Uevent::parse(&m).unwrap();
        assert_eq!(e.action, "add");
        assert_eq!(e.devpath, "/devices/pci0000:00/0000:00:04.0");
        assert_eq!(e.env["PCI_ID"], "10DE:20B0");
        assert!(e.is_pci_change());
    }

    #[test]
    fn other_subsystems_actions_and_udev_messages_are_not_pci_changes() {
        let net = message(&["add@/devices/virtual/net/veth0", "ACTION=add", "SUBSYSTEM=net"]);
        assert!(!Uevent::parse(&net).unwrap().is_pci_change());
        let online = message(&["online@/devices/pci0000:00/0000:00:04.0", "ACTION=online", "SUBSYSTEM=pci"]);
        assert!(!Uevent::parse(&online).unwrap().is_pci_change());
        // udevd's re-broadcast starts with "libudev\0" and a binary header: not a kernel message.
        let mut udev = b"libudev\0".to_vec();
        udev.extend_from_slice(&[0xfe, 0xed, 0xca, 0xfe]);
        assert_eq!(Uevent::parse(&udev), None);
        assert_eq!(Uevent::parse(b""), None);
    }

    #[test]
    fn the_header_stands_in_for_missing_keys() {
        let e =
            Uevent::parse(&message(&["remove@/devices/pci0000:00/0000:00:05.0", "SUBSYSTEM=pci"])).unwrap();
        assert_eq!((e.action.as_str(), e.devpath.as_str()), ("remove", "/devices/pci0000:00/0000:00:05.0"));
        assert!(e.is_pci_change());
    }

    proptest! {
        /// Any bytes parse or are refused without a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = Uevent::parse(&bytes);
        }
    }

    /// The real socket: a synthetic `change` written to a PCI device's `uevent` file (root only; harmless:
    /// the kernel re-announces the device) arrives as a PCI event. Skipped, saying so, where the socket, a PCI
    /// device or the write is not available.
    #[tokio::test]
    async fn a_synthetic_pci_uevent_arrives() {
        let mut events = match PciEvents::open() {
            Ok(e) => e,
            Err(e) => {
                eprintln!("skipped: cannot open the uevent socket: {e}");
                return;
            }
        };
        let Some(device) = std::fs::read_dir("/sys/bus/pci/devices").ok().and_then(|mut d| d.next()?.ok())
        else {
            eprintln!("skipped: no PCI device in /sys/bus/pci/devices");
            return;
        };
        if let Err(e) = std::fs::write(device.path().join("uevent"), "change") {
            eprintln!("skipped: cannot trigger a uevent on {}: {e}", device.path().display());
            return;
        }
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), events.next()).await;
        let event = event.expect("a PCI uevent within 10 s").unwrap();
        assert_eq!(event.action, "change");
        assert_eq!(event.env.get("PCI_SLOT_NAME").map(String::as_str), device.file_name().to_str());
    }
}
