//! The extender's `/metrics` under `--enable-rbac`, against the real API server: the token of each caller
//! is reviewed (TokenReview) and its access to the non-resource URL `/metrics` checked (SubjectAccessReview).
//! No token → 401; a ServiceAccount token without RBAC → 403; one bound to a ClusterRole allowing `get` on
//! `/metrics` → 200; an invalid token → 401. The probes stay open.
//!
//! Needs the control-plane binaries and `vgpu-scheduler-extender` built; run with `e2e/run.sh metrics_rbac`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use vgpu_e2e::plugin_node::EXTENDER;
use vgpu_e2e::{TestEnv, free_port, http_get, http_get_with_headers, vgpu_binary, wait_ready};

/// A token of ServiceAccount `default/<name>` (created first), from the TokenRequest API.
async fn service_account_token(client: &kube::Client, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let account = ServiceAccount {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        ..ServiceAccount::default()
    };
    accounts.create(&PostParams::default(), &account).await.unwrap();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(600), ..TokenRequestSpec::default() }),
        ..TokenRequest::default()
    };
    let answer = accounts.create_token_request(name, &PostParams::default(), &request).await.unwrap();
    answer.status.and_then(|s| s.token).expect("a token in the TokenRequest status")
}

/// ClusterRole `vgpu-metrics-reader` (`get` on `/metrics`) bound to ServiceAccount `default/<account>`.
async fn allow_metrics(client: &kube::Client, account: &str) {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role = ClusterRole {
        metadata: ObjectMeta { name: Some("vgpu-metrics-reader".into()), ..ObjectMeta::default() },
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    roles.create(&PostParams::default(), &role).await.unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta { name: Some("vgpu-metrics-reader".into()), ..ObjectMeta::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "vgpu-metrics-reader".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.into(),
            namespace: Some("default".into()),
            ..Subject::default()
        }]),
    };
    bindings.create(&PostParams::default(), &binding).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn extender_metrics_rbac_401_403_200() {
    let mut env = TestEnv::builder("extender_metrics_rbac_401_403_200").start().await.unwrap();
    let client = env.client().await.unwrap();

    // RBAC first, so that no refusal of the scraper is cached (2 s) before its binding exists.
    allow_metrics(&client, "scraper").await;
    let scraper = service_account_token(&client, "scraper").await;
    let nobody = service_account_token(&client, "nobody").await;

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
    let (status, _) = http_get(port, "/healthz").await.unwrap();
    assert_eq!(status, 200, "probes need no token");

    let (status, body) = http_get(port, "/metrics").await.unwrap();
    assert_eq!(status, 401, "no token: {body}");
    assert!(body.contains("no bearer token"), "{body}");

    let bearer = |token: &str| format!("Bearer {token}");
    let (status, body) =
        http_get_with_headers(port, "/metrics", &[("Authorization", &bearer("not-a-token"))]).await.unwrap();
    assert_eq!(status, 401, "invalid token: {body}");

    let (status, body) =
        http_get_with_headers(port, "/metrics", &[("Authorization", &bearer(&nobody))]).await.unwrap();
    assert_eq!(status, 403, "ServiceAccount without RBAC: {body}");
    assert!(body.contains("user=system:serviceaccount:default:nobody, verb=get, path=/metrics"), "{body}");

    // The RBAC authorizer's caches may lag the binding by a moment: poll (a refusal is cached 2 s).
    let header = bearer(&scraper);
    let body = env
        .poll("/metrics with the scraper's token answers 200", Duration::from_secs(20), || {
            let header = header.clone();
            async move {
                match http_get_with_headers(port, "/metrics", &[("Authorization", &header)]).await {
                    Ok((200, body)) => Some(body),
                    _ => None,
                }
            }
        })
        .await
        .unwrap();
    assert!(body.contains("vgpu_scheduler_"), "{body:.300}");
    env.check_process(EXTENDER).unwrap();
    env.finish();
}
