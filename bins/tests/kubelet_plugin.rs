//! `vgpu-kubelet-plugin` as a process on the mock backend: it binds its registration and DRA sockets under
//! temporary kubelet directories, answers the kubelet's `GetInfo` and an (empty) `NodePrepareResources` over
//! real unix sockets, exits 0 on SIGTERM removing both sockets, and after a SIGKILL (stale socket files
//! left behind) a new process replaces them and serves again. With `--http-endpoint` it serves `/healthz`,
//! `/readyz` and the metrics page over real HTTP on loopback, and with gate `SharedSMUtilizationWatcher` it
//! writes the shared SM watcher's file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use vgpu_kubelet::api::{dra_v1, pluginregistration as pr};
use vgpu_kubelet::socket::connect_unix;

const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576 }\n";

struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mock.yaml"), MOCK).unwrap();
        // A client that is never dialled until a claim is prepared.
        std::fs::write(
            dir.path().join("kubeconfig"),
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n\
             users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
        )
        .unwrap();
        Self { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn spawn(&self) -> Child {
        let arg = |flag: &str, rel: &str| format!("--{flag}={}", self.path(rel).display());
        // The vGPU runtime files an install step puts on the host.
        vgpu_core::abi::runtime_files::install(&self.path("manager"), "v1.0.0", b"").unwrap();
        Command::new(assert_cmd::cargo::cargo_bin("vgpu-kubelet-plugin"))
            .env_remove("FEATURE_GATES")
            .env("NODE_NAME", "node-1")
            .args([
                "--backend=mock".to_owned(),
                arg("mock-config", "mock.yaml"),
                arg("kubeconfig", "kubeconfig"),
                arg("kubelet-registrar-directory-path", "registry"),
                arg("kubelet-plugins-directory-path", "plugins"),
                arg("cdi-root", "cdi"),
                arg("host-manager-dir", "manager"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }

    fn registration(&self) -> PathBuf {
        self.path("registry/manager.nvidia.com-reg.sock")
    }
}

fn wait_for_socket(path: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !vgpu_dra::driver::socket_exists(path) {
        assert!(child.try_wait().unwrap().is_none(), "the plugin exited before serving");
        assert!(Instant::now() < deadline, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

async fn kubelet(registration: &Path) -> pr::PluginInfo {
    let channel = connect_unix(registration, Duration::from_secs(5)).await.unwrap();
    let info = pr::registration_client::RegistrationClient::new(channel)
        .get_info(pr::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let channel = connect_unix(Path::new(&info.endpoint), Duration::from_secs(5)).await.unwrap();
    let empty = dra_v1::dra_plugin_client::DraPluginClient::new(channel)
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: vec![] })
        .await
        .unwrap()
        .into_inner();
    assert!(empty.claims.is_empty());
    info
}

#[tokio::test]
async fn serves_the_kubelet_then_stops_on_sigterm_and_survives_sigkill() {
    let node = Node::new();
    let mut child = node.spawn();
    wait_for_socket(&node.registration(), &mut child);
    let info = kubelet(&node.registration()).await;
    assert_eq!(info.name, "manager.nvidia.com");
    assert_eq!(Path::new(&info.endpoint), node.path("plugins/manager.nvidia.com/dra.sock"));
    assert!(
        node.path("plugins/manager.nvidia.com/checkpoint.json").exists(),
        "the checkpoint is written at start"
    );

    // SIGKILL leaves the socket files; the next process replaces them.
    signal(&child, "-KILL");
    tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    assert!(node.registration().exists(), "a killed process cannot clean up");
    let mut child = node.spawn();
    // The stale file is replaced atomically: wait until the new process answers on it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(child.try_wait().unwrap().is_none(), "the restarted plugin exited");
        let probe = async {
            let channel = connect_unix(&node.registration(), Duration::from_secs(1)).await.ok()?;
            pr::registration_client::RegistrationClient::new(channel).get_info(pr::InfoRequest {}).await.ok()
        };
        if probe.await.is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the restarted plugin never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kubelet(&node.registration()).await;

    signal(&child, "-TERM");
    // Wait without blocking the runtime: the client side of our connections must be able to close.
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    assert!(status.success(), "{status}");
    assert!(!node.registration().exists() && !node.path("plugins/manager.nvidia.com/dra.sock").exists());
}

/// Removes ANSI colour sequences (`ESC [ … m`) from a log line.
fn strip_ansi(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One `GET` over a fresh loopback connection: (status, body).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.split(' ').nth(1).unwrap().parse().unwrap(), body.to_owned())
}

/// `--http-endpoint=127.0.0.1:0` (the plugin binds a free port and logs it) with gate
/// `SharedSMUtilizationWatcher`: `/healthz`, `/readyz` before and after the kubelet registers the plugin,
/// the metrics page at `--metrics-path`, and the shared SM watcher's file under the manager directory.
#[tokio::test]
async fn serves_metrics_and_runs_the_sm_watcher() {
    use std::io::BufRead;
    let node = Node::new();
    // The host manager directory exists, as a chart's hostPath (DirectoryOrCreate) makes it.
    std::fs::create_dir_all(node.path("manager")).unwrap();
    let arg = |flag: &str, rel: &str| format!("--{flag}={}", node.path(rel).display());
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("vgpu-kubelet-plugin"))
        .env_remove("FEATURE_GATES")
        .env("NODE_NAME", "node-1")
        .env("RUST_LOG", "info")
        .args([
            "--backend=mock".to_owned(),
            arg("mock-config", "mock.yaml"),
            arg("kubeconfig", "kubeconfig"),
            arg("kubelet-registrar-directory-path", "registry"),
            arg("kubelet-plugins-directory-path", "plugins"),
            arg("cdi-root", "cdi"),
            arg("host-manager-dir", "manager"),
            "--http-endpoint=127.0.0.1:0".to_owned(),
            "--metrics-path=/plugin-metrics".to_owned(),
            "--feature-gates=SharedSMUtilizationWatcher=true".to_owned(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let line = strip_ansi(&line);
            eprintln!("{line}");
            let _ = tx.send(line);
        }
    });
    let addr: std::net::SocketAddr = loop {
        let line =
            rx.recv_timeout(Duration::from_secs(30)).expect("the plugin never logged its metrics address");
        if line.contains("metrics, /healthz and /readyz serving")
            && let Some(rest) = line.split("bound=").nth(1)
        {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    wait_for_socket(&node.registration(), &mut child);
    assert_eq!(http_get(addr, "/healthz").await, (200, "ok".to_owned()));
    assert_eq!(http_get(addr, "/readyz").await.0, 503);

    kubelet(&node.registration()).await;
    let channel = connect_unix(&node.registration(), Duration::from_secs(5)).await.unwrap();
    pr::registration_client::RegistrationClient::new(channel)
        .notify_registration_status(pr::RegistrationStatus { plugin_registered: true, error: String::new() })
        .await
        .unwrap();
    assert_eq!(http_get(addr, "/readyz").await, (200, "ok".to_owned()));
    let (status, page) = http_get(addr, "/plugin-metrics").await;
    assert_eq!(status, 200);
    assert!(page.contains("vgpu_kubelet_plugin_prepared_claims 0\n"), "{page}");
    assert!(
        page.contains("vgpu_kubelet_plugin_request_duration_seconds_count{operation=\"prepare\"} 1\n"),
        "{page}"
    );
    assert!(page.contains("process_open_fds "), "{page}");
    // The API server of this test is unreachable: nothing was ever published.
    assert!(page.contains("vgpu_kubelet_plugin_resource_slice_pool_generation 0\n"), "{page}");

    let watcher = node.path("manager/watcher/sm_util.config");
    assert_eq!(std::fs::metadata(&watcher).unwrap().len(), vgpu_core::abi::sm_util::FILE_SIZE as u64);
    vgpu_core::abi::sm_util::read(&watcher).unwrap();

    signal(&child, "-TERM");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    assert!(status.success(), "{status}");
}
