//! Crash safety of the `vgpu-kubelet-plugin` binary (issue #17): the real process on the mock backend,
//! reading its ResourceClaim from a stand-in API server (plain HTTP/1.1 on loopback, answering the one
//! claim and 404 for everything else), is driven by a test kubelet over its real unix sockets. With the
//! test-only `VGPU_DRA_TEST_PAUSE_AT` it hangs inside `NodePrepareResources` right after `PrepareStarted`
//! (and, in a second round, after the directories and the CDI spec are written); the test reads the
//! checkpoint file to see that state, SIGKILLs the process, starts a new one (without the variable) and
//! prepares again: the started claim was rolled back at start-up (no CDI file, no claim directory, no
//! entry), the new Prepare succeeds once, a repeated Prepare returns the same devices without touching the
//! checkpoint, and exactly one CDI file and one claim directory exist.
//!
//! The same with a host action (issue #18): gate `DynamicMIG` on a mock A100 whose MIG state lives in a file,
//! the process hangs right after the MIG instance of its claim is created (`host-action`); after the SIGKILL
//! the state file shows the instance, the restarted process destroys it while rolling back, and a fresh
//! Prepare creates it once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use vgpu_dra::checkpoint::{Checkpoint, ClaimState};
use vgpu_kubelet::api::{dra_v1, pluginregistration as pr};
use vgpu_kubelet::socket::connect_unix;

const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576 }\n";
const UID: &str = "6f1c2a9e-0d4b-4c1e-9b7a-3e2f1d0c9b8a";
const CLAIM_PATH: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1";

/// The claim the API server answers: one vGPU share of `vgpu-0` on `node-1`, reserved for one pod.
fn claim_json() -> String {
    claim_of(serde_json::json!({
        "request": "gpu", "driver": "manager.nvidia.com", "pool": "node-1", "device": "vgpu-0",
        "shareID": "7b1e0c3a-5d6f-4a8b-9c0d-1e2f3a4b5c6d",
        "consumedCapacity": { "cores": "10", "memory": "1Gi" }
    }))
}

/// The MIG claim: `gpu-0-mig-5-0-4` (profile 4g.40gb, memory slices 0..4) of the mock A100.
fn mig_claim_json() -> String {
    claim_of(serde_json::json!({
        "request": "gpu", "driver": "manager.nvidia.com", "pool": "node-1", "device": "gpu-0-mig-5-0-4"
    }))
}

/// Claim `ns/c1` allocated `result`, reserved for one pod.
fn claim_of(result: serde_json::Value) -> String {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": { "name": "c1", "namespace": "ns", "uid": UID },
        "spec": { "devices": { "requests": [{ "name": "gpu", "exactly": { "deviceClassName": "vgpu-manager" } }] } },
        "status": {
            "allocation": { "devices": { "results": [result] } },
            "reservedFor": [{ "resource": "pods", "name": "app", "uid": "0b1a22cd-4e5f-4a6b-8c7d-9e0f1a2b3c4d" }]
        }
    })
    .to_string()
}

/// A stand-in for kube-apiserver: `GET` of the claim → 200 with it, anything else → 404 `Status`. Each
/// connection is answered once and closed. Returns its address; the listener lives in the task.
async fn fake_api_server(claim: String) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else { return };
            let claim = claim.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0_u8; 4096];
                let head_end = loop {
                    let Ok(n) = conn.read(&mut chunk).await else { return };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                while buf.len() < head_end + length {
                    let Ok(n) = conn.read(&mut chunk).await else { return };
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let mut words = head.split_whitespace();
                let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                let path = target.split('?').next().unwrap_or("");
                let (status, body) = if method == "GET" && path == CLAIM_PATH {
                    ("200 OK", claim)
                } else {
                    (
                        "404 Not Found",
                        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#
                            .to_owned(),
                    )
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    addr
}

struct Node {
    dir: tempfile::TempDir,
    gates: Option<&'static str>,
}

impl Node {
    fn new(api: std::net::SocketAddr) -> Self {
        Self::with(api, MOCK, None)
    }

    /// A node with the mock `mock` (`{dir}` is replaced by the node's directory) and `--feature-gates`.
    fn with(api: std::net::SocketAddr, mock: &str, gates: Option<&'static str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mock = mock.replace("{dir}", &dir.path().display().to_string());
        std::fs::write(dir.path().join("mock.yaml"), mock).unwrap();
        std::fs::write(
            dir.path().join("kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'http://{api}'}}}}]\n\
                 users: [{{name: u, user: {{token: t}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
            ),
        )
        .unwrap();
        Self { dir, gates }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The plugin; `pause` sets the test-only `VGPU_DRA_TEST_PAUSE_AT`.
    fn spawn(&self, pause: Option<&str>) -> Child {
        let arg = |flag: &str, rel: &str| format!("--{flag}={}", self.path(rel).display());
        // The vGPU runtime files an install step puts on the host.
        vgpu_core::abi::runtime_files::install(&self.path("manager"), "v1.0.0", b"").unwrap();
        let mut cmd = Command::new(assert_cmd::cargo::cargo_bin("vgpu-kubelet-plugin"));
        cmd.env_remove("FEATURE_GATES")
            .env_remove("VGPU_DRA_TEST_PAUSE_AT")
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
            .stderr(Stdio::inherit());
        if let Some(point) = pause {
            cmd.env("VGPU_DRA_TEST_PAUSE_AT", point);
        }
        if let Some(gates) = self.gates {
            cmd.arg(format!("--feature-gates={gates}"));
        }
        cmd.spawn().unwrap()
    }

    fn checkpoint(&self) -> Checkpoint {
        Checkpoint::load(&self.path("plugins/manager.nvidia.com/checkpoint.json")).unwrap()
    }

    fn cdi_file(&self) -> PathBuf {
        self.path(&format!("cdi/k8s.manager.nvidia.com-claim_{UID}.json"))
    }

    fn claim_dir(&self) -> PathBuf {
        self.path(&format!("manager/claims/{UID}"))
    }

    fn entries(&self, rel: &str) -> usize {
        std::fs::read_dir(self.path(rel)).map(|d| d.count()).unwrap_or(0)
    }
}

/// The DRA endpoint, once the process answers `GetInfo` on its registration socket.
async fn endpoint(node: &Node, child: &mut Child) -> PathBuf {
    let registration = node.path("registry/manager.nvidia.com-reg.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(child.try_wait().unwrap().is_none(), "the plugin exited before serving");
        let probe = async {
            let channel = connect_unix(&registration, Duration::from_secs(1)).await.ok()?;
            pr::registration_client::RegistrationClient::new(channel).get_info(pr::InfoRequest {}).await.ok()
        };
        if let Some(info) = probe.await {
            return PathBuf::from(info.into_inner().endpoint);
        }
        assert!(Instant::now() < deadline, "the plugin never answered GetInfo");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn prepare(endpoint: &Path) -> Result<dra_v1::NodePrepareResourceResponse, tonic::Status> {
    let channel = connect_unix(endpoint, Duration::from_secs(5)).await.unwrap();
    let claim = dra_v1::Claim { namespace: "ns".into(), uid: UID.into(), name: "c1".into() };
    let mut response = dra_v1::dra_plugin_client::DraPluginClient::new(channel)
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: vec![claim] })
        .await?
        .into_inner();
    Ok(response.claims.remove(UID).unwrap())
}

fn kill(child: &mut Child) {
    let status = Command::new("kill").args(["-KILL", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    child.wait().unwrap();
}

type PrepareCall = tokio::task::JoinHandle<Result<dra_v1::NodePrepareResourceResponse, tonic::Status>>;

/// Starts the plugin paused at `point`, sends the kubelet's Prepare (it hangs in the process) and waits until the
/// claim is `PrepareStarted` and `reached` holds; returns the plugin and the pending call.
async fn hang_prepare_at(node: &Node, point: &str, reached: impl Fn(&Node) -> bool) -> (Child, PrepareCall) {
    let mut child = node.spawn(Some(point));
    let dra = endpoint(node, &mut child).await;
    let call = tokio::spawn(async move { prepare(&dra).await });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let started = node.checkpoint().claims().get(UID).map(|c| c.checkpoint_state);
        if started == Some(ClaimState::PrepareStarted) && reached(node) {
            return (child, call);
        }
        assert!(child.try_wait().unwrap().is_none(), "{point}: the plugin exited");
        assert!(Instant::now() < deadline, "{point}: never reached (state {started:?})");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_prepare_started_and_completed_then_restart_prepares_once() {
    let api = fake_api_server(claim_json()).await;
    for (point, files_written) in [("prepare-started", false), ("side-effects", true)] {
        let node = Node::new(api);
        // The kubelet's Prepare hangs in the process (the test-only pause).
        let (mut child, call) =
            hang_prepare_at(&node, point, |n| n.cdi_file().exists() == files_written).await;
        // Give a Prepare that would wrongly go on the chance to finish: it must still be started.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(node.checkpoint().claims()[UID].checkpoint_state, ClaimState::PrepareStarted, "{point}");
        assert_eq!(node.claim_dir().exists(), files_written, "{point}");
        kill(&mut child);
        assert!(call.await.unwrap().is_err(), "{point}: the killed process cannot answer");

        // Restart: the started claim is rolled back before anything is served.
        let mut child = node.spawn(None);
        let dra = endpoint(&node, &mut child).await;
        assert!(node.checkpoint().claims().is_empty(), "{point}: rolled back at start-up");
        assert!(!node.cdi_file().exists() && !node.claim_dir().exists(), "{point}: nothing leaked");

        // Prepare again: once.
        let done = prepare(&dra).await.unwrap();
        assert_eq!(done.error, "", "{point}");
        assert_eq!(done.devices.len(), 1);
        assert_eq!(done.devices[0].device_name, "vgpu-0");
        let cp = node.checkpoint();
        assert_eq!(cp.claims()[UID].checkpoint_state, ClaimState::PrepareCompleted);
        assert_eq!((node.entries("cdi"), node.entries("manager/claims")), (1, 1), "{point}");
        assert!(node.claim_dir().join("gpu/config/pids.config").exists(), "{point}");
        let spec: vgpu_core::cdi::Spec =
            serde_json::from_slice(&std::fs::read(node.cdi_file()).unwrap()).unwrap();
        assert_eq!(vgpu_core::cdi::validate(&spec), Ok(()));
        // No double prepare: the same devices, the checkpoint untouched.
        let bytes = std::fs::read(node.path("plugins/manager.nvidia.com/checkpoint.json")).unwrap();
        let again = prepare(&dra).await.unwrap();
        assert_eq!(again.devices, done.devices);
        assert_eq!(std::fs::read(node.path("plugins/manager.nvidia.com/checkpoint.json")).unwrap(), bytes);
        assert_eq!((node.entries("cdi"), node.entries("manager/claims")), (1, 1));
        kill(&mut child);
    }
}

/// The MIG instances in the node's mock state file: (profile, placement start).
fn mig_instances(node: &Node) -> Vec<(String, u32)> {
    let backend = vgpu_core::backend::mock::MockBackend::from_path(&node.path("mock.yaml")).unwrap();
    let layout = vgpu_core::backend::DeviceBackend::mig_layout(&backend, 0).unwrap();
    layout.instances.into_iter().map(|i| (i.profile.to_string(), i.placement_start)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_a_mig_instance_is_created_then_restart_destroys_it_and_prepares_once() {
    const A100: &str = "gpus:\n  - { uuid: GPU-MIG-0, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, computeCapability: '8.0', mig: { mode: Enabled } }\nmigStateFile: {dir}/mig-state.json\n";
    let api = fake_api_server(mig_claim_json()).await;
    let node = Node::with(api, A100, Some("DynamicMIG=true,NVMLDeviceHealthCheck=false"));
    // Hung after the first host action: the instance exists, the claim is started, no CDI spec yet.
    let (mut child, call) = hang_prepare_at(&node, "host-action", |n| !mig_instances(n).is_empty()).await;
    let recorded = node.checkpoint().claims()[UID].host_actions.clone();
    assert_eq!(recorded.iter().map(|a| a.mode.as_str()).collect::<Vec<_>>(), ["mig"]);
    assert_eq!(mig_instances(&node), [("4g.40gb".to_owned(), 0)]);
    assert!(!node.cdi_file().exists());
    kill(&mut child);
    assert!(call.await.unwrap().is_err(), "the killed process cannot answer");
    assert_eq!(mig_instances(&node), [("4g.40gb".to_owned(), 0)], "a crash leaves the instance");

    // Restart: recovery reverts the recorded action — the instance is destroyed before anything is served.
    let mut child = node.spawn(None);
    let dra = endpoint(&node, &mut child).await;
    assert!(node.checkpoint().claims().is_empty(), "rolled back at start-up");
    assert!(mig_instances(&node).is_empty(), "the instance was destroyed");
    assert!(!node.cdi_file().exists());

    // Prepare again: one instance, once.
    let done = prepare(&dra).await.unwrap();
    assert_eq!(done.error, "");
    assert_eq!(done.devices.len(), 1);
    assert_eq!(done.devices[0].device_name, "gpu-0-mig-5-0-4");
    assert_eq!(mig_instances(&node), [("4g.40gb".to_owned(), 0)]);
    assert_eq!(node.checkpoint().claims()[UID].checkpoint_state, ClaimState::PrepareCompleted);
    let again = prepare(&dra).await.unwrap();
    assert_eq!(again.devices, done.devices);
    assert_eq!(mig_instances(&node).len(), 1, "no second instance");
    kill(&mut child);
}
