//! The DRA kubelet plugin's (the gpu-module adapters') metrics under `--enable-rbac`, against the real API
//! server: the `vgpu-kubelet-plugin` binary on the mock backend, `--http-endpoint` on loopback. Each
//! caller's token is reviewed (TokenReview) and its access to the non-resource URL `/metrics` checked
//! (SubjectAccessReview): no token → 401; an invalid token → 401; a ServiceAccount token without RBAC → 403;
//! one bound to a ClusterRole allowing `get` on `/metrics` → 200, with the plugin's families (prepared claims,
//! per-device health). `/healthz` and `/readyz` stay open (no 401).
//!
//! Control plane only (no kubelet). Needs the control-plane binaries and `vgpu-kubelet-plugin` built: run
//! `e2e/run.sh kubelet_plugin_metrics_rbac`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use vgpu_e2e::rbac::{allow_metrics, assert_metrics_rbac, service_account_token};
use vgpu_e2e::{TestEnv, fixtures, free_port, http_get, vgpu_binary};

const PLUGIN: &str = "vgpu-kubelet-plugin";
const NODE: &str = "metrics-rbac-node";
const MOCK: &str =
    "gpus:\n  - { uuid: GPU-RBAC-0, name: NVIDIA A30, memoryMiB: 24576, computeCapability: '8.0' }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn kubelet_plugin_metrics_rbac_401_403_200() {
    let mut env = TestEnv::builder("kubelet_plugin_metrics_rbac_401_403_200").start().await.unwrap();
    let client = env.client().await.unwrap();
    fixtures::create_dra_node_and_classes(&client, NODE).await.unwrap();

    // RBAC first, so that no refusal of the scraper is cached (2 s) before its binding exists.
    allow_metrics(&client, "scraper").await.unwrap();
    let scraper = service_account_token(&client, "scraper").await.unwrap();
    let nobody = service_account_token(&client, "nobody").await.unwrap();

    let dir = env.workdir().join("node");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("mock.yaml"), MOCK).unwrap();
    let path = |rel: &str| dir.join(rel).display().to_string();
    vgpu_core::abi::runtime_files::install(&dir.join("manager"), "v1.0.0", b"").unwrap();
    let port = free_port().unwrap();
    let args = vec![
        "--backend=mock".to_owned(),
        format!("--mock-config={}", path("mock.yaml")),
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--kubelet-registrar-directory-path={}", path("plugins_registry")),
        format!("--kubelet-plugins-directory-path={}", path("plugins")),
        format!("--cdi-root={}", path("cdi")),
        format!("--host-manager-dir={}", path("manager")),
        format!("--http-endpoint=127.0.0.1:{port}"),
        "--enable-rbac=true".to_owned(),
    ];
    let env_vars = vec![("NODE_NAME".to_owned(), NODE.to_owned())];
    env.start_process(PLUGIN, &vgpu_binary(PLUGIN).unwrap(), &args, &env_vars).unwrap();
    let up = env
        .poll("the plugin's /healthz", Duration::from_secs(60), || async {
            matches!(http_get(port, "/healthz").await, Ok((200, _))).then_some(())
        })
        .await;
    if let Err(e) = up {
        panic!("{e}\n{PLUGIN} log:\n{}", env.log_tail(PLUGIN, 30));
    }
    // Readiness is open too: not registered with a kubelet here, so 503, never 401.
    let (status, body) = http_get(port, "/readyz").await.unwrap();
    assert_eq!(status, 503, "/readyz without a kubelet: {body}");

    let page = assert_metrics_rbac(&env, port, &nobody, &scraper).await.unwrap();
    assert!(page.contains("vgpu_kubelet_plugin_prepared_claims 0"), "{page:.600}");
    assert!(page.contains("vgpu_kubelet_plugin_device_health_monitored"), "{page:.600}");
    assert!(
        page.contains("vgpu_kubelet_plugin_device_health{device=") && page.contains("uuid=\"GPU-RBAC-0\""),
        "{page}"
    );
    env.check_process(PLUGIN).unwrap();
    env.finish();
}
