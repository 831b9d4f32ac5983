//! Loopback ports, and this host's own address.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::time::Instant;

/// `n` distinct free TCP ports on 127.0.0.1 (all bound at once, then released).
pub(crate) fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<std::io::Result<Vec<_>>>()
        .context("binding a free port on 127.0.0.1")?;
    listeners.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

/// This host's address on its default route (the source address the kernel picks for an outside
/// destination; nothing is sent). Pods reach the host there, through their bridge's gateway.
pub(crate) fn host_address() -> Result<Ipv4Addr> {
    let socket = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).context("binding a UDP socket")?;
    // TEST-NET-3: never routed anywhere; connecting a UDP socket only asks the routing table.
    socket
        .connect((Ipv4Addr::new(203, 0, 113, 1), 9))
        .context("this host has no default route: pods could not reach the API server")?;
    match socket.local_addr().context("reading the UDP socket's address")?.ip() {
        std::net::IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() => Ok(ip),
        other => bail!("the default route's source address {other} is not one pods can reach"),
    }
}

/// Waits until something accepts TCP connections on `127.0.0.1:port`, or `timeout` passes.
/// `alive` is checked between attempts and aborts the wait with its error.
pub(crate) async fn wait_for_port(
    port: u16,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<()>,
) -> Result<()> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + timeout;
    loop {
        alive()?;
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("nothing listens on {addr} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct() {
        let ports = free_ports(4).unwrap();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 4);
    }

    #[tokio::test]
    async fn wait_for_port_times_out_and_succeeds() {
        // A socket bound but not listening holds the port (no parallel test can take it)
        // and refuses connections.
        let held = tokio::net::TcpSocket::new_v4().unwrap();
        held.bind((Ipv4Addr::LOCALHOST, 0).into()).unwrap();
        let port = held.local_addr().unwrap().port();
        let err = wait_for_port(port, Duration::from_millis(300), || Ok(())).await.unwrap_err();
        assert!(err.to_string().contains("nothing listens"), "{err}");
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        wait_for_port(port, Duration::from_secs(5), || Ok(())).await.unwrap();
    }
}
