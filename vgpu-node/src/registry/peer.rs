//! Who is on the other end of a registry connection, resolved once, when the connection is accepted.
//!
//! [`IdentifiedStream`] wraps each accepted unix stream; its [`Connected::connect_info`] hands tonic the
//! [`CallerIdentity`] resolved at accept time, which every request on that connection then finds in its
//! extensions. Nothing reads the socket credentials or the caller's `/proc` entries by PID again at
//! request time: a PID that is reused between the connection and a request cannot pass for the caller.
//!
//! At accept, in this order:
//!
//! 1. the socket credentials (`SO_PEERCRED`: pid, uid, gid — what the kernel recorded at `connect()`);
//! 2. a [`ProcessHandle`] on that PID: an open `/proc/<pid>/stat` of this process's own procfs
//!    ([`OWN_PROC`], the PID namespace `SO_PEERCRED` reports PIDs in). The open file refers to that
//!    process, never to a later one with the same number: reading it fails with `ESRCH` once the process
//!    is reaped, and shows state `Z` once it has exited (the same guarantee a pidfd gives);
//! 3. the process's uids from `/proc/<pid>/status`: the socket's uid must be one of its real, effective,
//!    saved or filesystem uids — otherwise another process already holds the PID (reused between
//!    `connect()` and accept) and the connection is refused;
//! 4. `<proc-root>/<pid>/cgroup` → the cgroup path → the pod UID (per the cgroup driver);
//! 5. the handle is checked again: the process is still the one the handle was opened on, so what steps 3
//!    and 4 read belongs to it.
//!
//! A failure in any step does not drop the connection: it is kept as the identity's error and every
//! request on the connection is refused with it (`PermissionDenied`, naming what failed).

use std::{
    fs::File,
    io,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::UnixStream,
};
use tonic::transport::server::Connected;
use vgpu_core::node_config::CgroupDriver;

use crate::registry::cgroup::{cgroup_path_of, pod_uid_from_cgroup_path};

/// This process's own procfs: the process handles and the caller's uids are read there (the PID namespace
/// the socket credentials are reported in), whatever `--host-proc-root` says.
pub const OWN_PROC: &str = "/proc";

/// The socket credentials of a connection, as the kernel recorded them when the peer called `connect()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The connecting process (in this process's PID namespace).
    pub pid: u32,
    /// Its effective uid.
    pub uid: u32,
    /// Its effective gid.
    pub gid: u32,
}

/// The container cgroup a caller was found in at accept time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerCgroup {
    /// The cgroup path (`0::<path>` of cgroup v2, else the v1 `memory` controller's).
    pub path: String,
    /// Whether `path` is a cgroup v2 path.
    pub v2: bool,
    /// The pod UID in `path`, per the node's cgroup driver (`None`: not a pod's cgroup).
    pub pod_uid: Option<String>,
}

/// Why a connection's caller could not be identified (every request on it is refused with this).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The socket did not report the peer's credentials.
    #[error("caller credentials (SO_PEERCRED) unavailable: {0}")]
    NoCredentials(String),
    /// The caller was gone before its connection was accepted.
    #[error("caller process {pid} (uid {uid}) exited before its connection was accepted: refused")]
    ExitedBeforeAccept {
        /// The PID the socket reported.
        pid: u32,
        /// The uid the socket reported.
        uid: u32,
    },
    /// The caller exited while it was being identified.
    #[error("caller process {pid} (uid {uid}) exited while its connection was being accepted: refused")]
    ExitedDuringAccept {
        /// The PID the socket reported.
        pid: u32,
        /// The uid the socket reported.
        uid: u32,
    },
    /// The process now holding the PID runs as other users than the one that connected.
    #[error(
        "process {pid} runs as uids {process_uids:?} but the connection was made by uid {uid}: the PID was \
         reused before the connection was accepted: refused"
    )]
    UidMismatch {
        /// The PID the socket reported.
        pid: u32,
        /// The uid the socket reported.
        uid: u32,
        /// Real, effective, saved and filesystem uids of the process now at `pid`.
        process_uids: Vec<u32>,
    },
    /// A `/proc` entry of the caller could not be read.
    #[error("caller {pid}: {}: {source}", path.display())]
    Proc {
        /// The PID the socket reported.
        pid: u32,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A `/proc` entry of the caller did not have the expected content.
    #[error("caller {pid}: {}: {what}", path.display())]
    Malformed {
        /// The PID the socket reported.
        pid: u32,
        /// The file.
        path: PathBuf,
        /// What was missing.
        what: &'static str,
    },
}

/// Whether the process a [`ProcessHandle`] was opened on still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// It runs (state other than zombie/dead).
    Alive,
    /// It exited (zombie, dead or reaped).
    Exited,
}

/// A handle on one process that never follows its PID to another process: an open `/proc/<pid>/stat`
/// plus the process's start time (the stable, `unsafe`-free stand-in for a pidfd).
#[derive(Debug)]
pub struct ProcessHandle {
    stat: File,
    start_time: u64,
}

/// State (field 3) and start time (field 22) of a `/proc/<pid>/stat` text.
fn parse_stat(text: &str) -> Option<(char, u64)> {
    // The command name (field 2) is in parentheses and may itself hold spaces and parentheses.
    let (_, rest) = text.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4..=21 lie between the state and the start time.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some((state, start_time))
}

impl ProcessHandle {
    /// Opens a handle on process `pid` under `proc_root` (normally [`OWN_PROC`]); `Ok(None)` when there is
    /// no such process or it already exited.
    pub fn open(proc_root: &Path, pid: u32) -> io::Result<Option<Self>> {
        let path = proc_root.join(pid.to_string()).join("stat");
        let stat = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(ESRCH) => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match read_stat(&stat)? {
            Some((state, start_time)) if !exited_state(state) => Ok(Some(Self { stat, start_time })),
            Some(_) | None => Ok(None),
        }
    }

    /// Whether the process still runs; an error other than "no such process" counts as exited (fail
    /// closed).
    pub fn liveness(&self) -> Liveness {
        match read_stat(&self.stat) {
            Ok(Some((state, start))) if !exited_state(state) && start == self.start_time => Liveness::Alive,
            _ => Liveness::Exited,
        }
    }
}

const ESRCH: i32 = 3;

fn exited_state(state: char) -> bool {
    matches!(state, 'Z' | 'X' | 'x')
}

/// Reads an open `stat` file from its start; `Ok(None)` when the process is gone (`ESRCH`) or the text
/// is not a stat line.
fn read_stat(file: &File) -> io::Result<Option<(char, u64)>> {
    let mut buf = vec![0u8; 1024];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match file.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.raw_os_error() == Some(ESRCH) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf.get(..len).and_then(|b| std::str::from_utf8(b).ok()).and_then(parse_stat))
}

/// Real, effective, saved and filesystem uids from a `/proc/<pid>/status` text (`Uid:` line).
pub fn status_uids(text: &str) -> Option<Vec<u32>> {
    let line = text.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let uids: Vec<u32> = line.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
    (!uids.is_empty()).then_some(uids)
}

/// The effective uid (second field of `Uid:`) of a `/proc/<pid>/status` text.
pub fn status_effective_uid(text: &str) -> Option<u32> {
    status_uids(text).and_then(|u| u.get(1).copied())
}

/// A caller, identified when its connection was accepted (see the module docs).
#[derive(Debug)]
pub struct CallerIdentity {
    /// The socket credentials (`None` only when the socket did not report them).
    pub credentials: Option<PeerCredentials>,
    /// The caller's container cgroup, or why it could not be identified.
    pub cgroup: Result<CallerCgroup, IdentityError>,
    handle: Option<ProcessHandle>,
}

/// How the accept-time identification reads `/proc`.
#[derive(Debug, Clone)]
pub struct IdentifyConfig {
    /// Where the process handle and the caller's uids are read ([`OWN_PROC`] in production).
    pub own_proc: PathBuf,
    /// The host's `/proc` as this process sees it (the caller's `cgroup`).
    pub proc_root: PathBuf,
    /// The node's cgroup driver.
    pub cgroup_driver: CgroupDriver,
    /// Whether the host's cgroup mount is a unified v2 hierarchy ([`is_unified`](crate::registry::cgroup::is_unified)): which line of
    /// `/proc/<pid>/cgroup` names the caller's cgroup ([`cgroup_path_of`]).
    pub unified: bool,
}

impl CallerIdentity {
    /// Identifies the peer of `stream` (see the module docs).
    pub fn of_stream(stream: &UnixStream, config: &IdentifyConfig) -> Self {
        match stream.peer_cred() {
            Ok(cred) => match cred.pid().and_then(|p| u32::try_from(p).ok()) {
                Some(0) => Self::refused(IdentityError::NoCredentials(
                    "the socket reported PID 0: the caller is outside this process's PID namespace (run the \
                     device plugin with hostPID: true)"
                        .to_owned(),
                )),
                Some(pid) => {
                    Self::identify(PeerCredentials { pid, uid: cred.uid(), gid: cred.gid() }, config)
                }
                None => Self::refused(IdentityError::NoCredentials("the socket reported no PID".to_owned())),
            },
            Err(e) => Self::refused(IdentityError::NoCredentials(e.to_string())),
        }
    }

    fn refused(err: IdentityError) -> Self {
        Self { credentials: None, cgroup: Err(err), handle: None }
    }

    /// Identifies the process with socket credentials `cred`.
    pub fn identify(cred: PeerCredentials, config: &IdentifyConfig) -> Self {
        let PeerCredentials { pid, uid, .. } = cred;
        let proc_err = |path: PathBuf| move |source| IdentityError::Proc { pid, path, source };
        let handle = match ProcessHandle::open(&config.own_proc, pid) {
            Ok(Some(h)) => h,
            Ok(None) => {
                return Self {
                    credentials: Some(cred),
                    cgroup: Err(IdentityError::ExitedBeforeAccept { pid, uid }),
                    handle: None,
                };
            }
            Err(e) => {
                let path = config.own_proc.join(pid.to_string()).join("stat");
                return Self { credentials: Some(cred), cgroup: Err(proc_err(path)(e)), handle: None };
            }
        };
        let cgroup = (|| {
            let status = config.own_proc.join(pid.to_string()).join("status");
            let text = std::fs::read_to_string(&status).map_err(proc_err(status.clone()))?;
            let process_uids = status_uids(&text).ok_or(IdentityError::Malformed {
                pid,
                path: status,
                what: "no Uid: line",
            })?;
            if !process_uids.contains(&uid) {
                return Err(IdentityError::UidMismatch { pid, uid, process_uids });
            }
            let file = config.proc_root.join(pid.to_string()).join("cgroup");
            let text = std::fs::read_to_string(&file).map_err(proc_err(file.clone()))?;
            let (path, v2) = cgroup_path_of(&text, config.unified).ok_or(IdentityError::Malformed {
                pid,
                path: file,
                what: "no cgroup",
            })?;
            let pod_uid = pod_uid_from_cgroup_path(&path, config.cgroup_driver);
            Ok(CallerCgroup { path, v2, pod_uid })
        })();
        // What was read belongs to the process the handle is on only if it still runs now.
        let cgroup = match handle.liveness() {
            Liveness::Alive => cgroup,
            Liveness::Exited => Err(IdentityError::ExitedDuringAccept { pid, uid }),
        };
        Self { credentials: Some(cred), cgroup, handle: Some(handle) }
    }

    /// Whether the caller still runs (always [`Liveness::Exited`] when it was never identified).
    pub fn liveness(&self) -> Liveness {
        self.handle.as_ref().map_or(Liveness::Exited, ProcessHandle::liveness)
    }
}

/// An accepted registry connection with its caller's accept-time identity.
#[derive(Debug)]
pub struct IdentifiedStream {
    inner: UnixStream,
    identity: Arc<CallerIdentity>,
}

impl IdentifiedStream {
    /// Identifies the peer of `inner` now.
    pub fn accept(inner: UnixStream, config: &IdentifyConfig) -> Self {
        let identity = Arc::new(CallerIdentity::of_stream(&inner, config));
        Self { inner, identity }
    }
}

impl Connected for IdentifiedStream {
    type ConnectInfo = Arc<CallerIdentity>;

    fn connect_info(&self) -> Self::ConnectInfo {
        Arc::clone(&self.identity)
    }
}

impl AsyncRead for IdentifiedStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for IdentifiedStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn stat_lines_parse_past_odd_command_names() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200 18446744073709551615";
        assert_eq!(parse_stat(line), Some(('S', 987_654)));
        assert_eq!(parse_stat("7 (zombie) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0"), Some(('Z', 55)));
        assert_eq!(parse_stat("7 (short) S 1 2"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn uids_from_status() {
        let text = "Name:\tsh\nUid:\t1000\t1001\t1002\t1003\nGid:\t5\t5\t5\t5\n";
        assert_eq!(status_uids(text), Some(vec![1000, 1001, 1002, 1003]));
        assert_eq!(status_effective_uid(text), Some(1001));
        assert_eq!(status_uids("Name:\tx\n"), None);
        assert_eq!(status_uids("Uid:\tx\n"), None);
    }

    #[test]
    fn a_handle_sees_its_own_process_exit() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let handle = ProcessHandle::open(Path::new(OWN_PROC), child.id()).unwrap().unwrap();
        assert_eq!(handle.liveness(), Liveness::Alive);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(handle.liveness(), Liveness::Exited, "reaped: the open stat file reports ESRCH");
    }
}
