//! The extender's `/metrics` under `--enable-rbac`, against the real API server: the token of each caller
//! is reviewed (TokenReview) and its access to the non-resource URL `/metrics` checked (SubjectAccessReview).
//! No token → 401; a ServiceAccount token without RBAC → 403; one bound to a ClusterRole allowing `get` on
//! `/metrics` → 200; an invalid token → 401. The probes stay open.
//!
//! Needs the control-plane binaries and `vgpu-scheduler-extender` built; run with `e2e/run.sh metrics_rbac`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use vgpu_e2e::plugin_node::EXTENDER;
use vgpu_e2e::rbac::{allow_metrics, assert_metrics_rbac, service_account_token};
use vgpu_e2e::{TestEnv, free_port, http_get, vgpu_binary, wait_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn extender_metrics_rbac_401_403_200() {
    let mut env = TestEnv::builder("extender_metrics_rbac_401_403_200").start().await.unwrap();
    let client = env.client().await.unwrap();

    // RBAC first, so that no refusal of the scraper is cached (2 s) before its binding exists.
    allow_metrics(&client, "scraper").await.unwrap();
    let scraper = service_account_token(&client, "scraper").await.unwrap();
    let nobody = service_account_token(&client, "nobody").await.unwrap();

    let port = free_port().unwrap();
    let args = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--server-bind-port={port}"),
        "--enable-rbac".to_owned(),
    ];
    env.start_process(EXTENDER, &vgpu_binary(EXTENDER).unwrap(), &args, &[]).unwrap();
    if let Err(e) = wait_ready(port, Duration::from_secs(60)).await {
        panic!("{e}\n{EXTENDER} log:\n{}", env.log_tail(EXTENDER, 30));
    }
    let (status, body) = http_get(port, "/metrics").await.unwrap();
    assert_eq!(status, 401, "no token: {body}");
    assert!(body.contains("no bearer token"), "{body}");
    let body = assert_metrics_rbac(&env, port, &nobody, &scraper).await.unwrap();
    assert!(body.contains("vgpu_scheduler_"), "{body:.300}");
    env.check_process(EXTENDER).unwrap();
    env.finish();
}
