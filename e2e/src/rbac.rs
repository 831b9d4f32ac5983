//! `/metrics` behind `--enable-rbac` (the kube-rbac-proxy contract), as every component that serves it is
//! checked: ServiceAccount tokens from the TokenRequest API, a ClusterRole allowing `get` on `/metrics`, and the
//! 401 / 401 / 403 / 200 sequence against a running server.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;

use crate::{TestEnv, http_get, http_get_with_headers};

/// Name of the ClusterRole (and its binding) [`allow_metrics`] creates.
pub const METRICS_READER: &str = "vgpu-metrics-reader";

/// A token of ServiceAccount `default/<name>` (created first), from the TokenRequest API.
pub async fn service_account_token(client: &kube::Client, name: &str) -> Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let account = ServiceAccount {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        ..ServiceAccount::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .with_context(|| format!("creating ServiceAccount {name}"))?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(600), ..TokenRequestSpec::default() }),
        ..TokenRequest::default()
    };
    let answer = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token of ServiceAccount {name}"))?;
    answer.status.and_then(|s| s.token).context("no token in the TokenRequest status")
}

/// ClusterRole [`METRICS_READER`] (`get` on `/metrics`) bound to ServiceAccount `default/<account>`.
pub async fn allow_metrics(client: &kube::Client, account: &str) -> Result<()> {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role = ClusterRole {
        metadata: ObjectMeta { name: Some(METRICS_READER.into()), ..ObjectMeta::default() },
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    roles.create(&PostParams::default(), &role).await.context("creating the metrics ClusterRole")?;
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta { name: Some(METRICS_READER.into()), ..ObjectMeta::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: METRICS_READER.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.into(),
            namespace: Some("default".into()),
            ..Subject::default()
        }]),
    };
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .context("creating the metrics ClusterRoleBinding")?;
    Ok(())
}

/// Checks `/metrics` on `127.0.0.1:<port>` under `--enable-rbac`: `/healthz` open; no token 401; an invalid
/// token 401; `nobody`'s token (ServiceAccount `default/nobody`, no RBAC) 403 naming user, verb and path;
/// `scraper`'s token (bound by [`allow_metrics`]) 200 — polled, since the API server's authorizer may lag the
/// binding by a moment and a refusal is cached 2 s. Returns the page.
pub async fn assert_metrics_rbac(env: &TestEnv, port: u16, nobody: &str, scraper: &str) -> Result<String> {
    let (status, _) = http_get(port, "/healthz").await?;
    ensure!(status == 200, "probes need no token: /healthz answered {status}");
    let (status, body) = http_get(port, "/metrics").await?;
    ensure!(status == 401, "no token: {status} {body}");
    let bearer = |token: &str| format!("Bearer {token}");
    let (status, body) =
        http_get_with_headers(port, "/metrics", &[("Authorization", &bearer("not-a-token"))]).await?;
    ensure!(status == 401, "invalid token: {status} {body}");
    let (status, body) =
        http_get_with_headers(port, "/metrics", &[("Authorization", &bearer(nobody))]).await?;
    ensure!(status == 403, "ServiceAccount without RBAC: {status} {body}");
    ensure!(
        body.contains("user=system:serviceaccount:default:nobody, verb=get, path=/metrics"),
        "the 403 names user, verb and path: {body}"
    );
    let header = bearer(scraper);
    env.poll("/metrics with the scraper's token answers 200", Duration::from_secs(20), || {
        let header = header.clone();
        async move {
            match http_get_with_headers(port, "/metrics", &[("Authorization", &header)]).await {
                Ok((200, body)) => Some(body),
                _ => None,
            }
        }
    })
    .await
}

/// Creates `object` unless it exists (409 is fine: several components share a namespace).
async fn create_or_keep<K>(api: Api<K>, object: &K) -> Result<()>
where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize
        + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Applies the RBAC objects of a deploy manifest (ServiceAccount — creating its namespace —, ClusterRole,
/// ClusterRoleBinding, Role, RoleBinding; other kinds such as the Deployment are skipped) and returns the
/// ServiceAccount as `(namespace, name)`.
pub async fn apply_rbac_manifest(client: &kube::Client, manifest: &Path) -> Result<(String, String)> {
    let text =
        std::fs::read_to_string(manifest).with_context(|| format!("reading {}", manifest.display()))?;
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {}", manifest.display()))?;
    let mut account = None;
    for doc in docs {
        let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default").to_owned();
        match doc["kind"].as_str() {
            Some("ServiceAccount") => {
                let sa: ServiceAccount = serde_json::from_value(doc)?;
                let namespace: Namespace =
                    serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?;
                create_or_keep(Api::<Namespace>::all(client.clone()), &namespace).await?;
                create_or_keep(Api::<ServiceAccount>::namespaced(client.clone(), &ns), &sa).await?;
                account = Some((ns, sa.metadata.name.unwrap_or_default()));
            }
            Some("ClusterRole") => {
                let role: ClusterRole = serde_json::from_value(doc)?;
                create_or_keep(Api::<ClusterRole>::all(client.clone()), &role).await?;
            }
            Some("ClusterRoleBinding") => {
                let binding: ClusterRoleBinding = serde_json::from_value(doc)?;
                create_or_keep(Api::<ClusterRoleBinding>::all(client.clone()), &binding).await?;
            }
            Some("Role") => {
                let role: Role = serde_json::from_value(doc)?;
                create_or_keep(Api::<Role>::namespaced(client.clone(), &ns), &role).await?;
            }
            Some("RoleBinding") => {
                let binding: RoleBinding = serde_json::from_value(doc)?;
                create_or_keep(Api::<RoleBinding>::namespaced(client.clone(), &ns), &binding).await?;
            }
            _ => {}
        }
    }
    match account {
        Some(account) => Ok(account),
        None => bail!("{} has no ServiceAccount", manifest.display()),
    }
}

/// Writes `<workdir>/<file_name>`: the admin kubeconfig with every user's credentials replaced by a one-hour
/// token of ServiceAccount `namespace/name` (TokenRequest API); returns its path.
pub async fn token_kubeconfig(
    env: &TestEnv,
    client: &kube::Client,
    (namespace, name): (&str, &str),
    file_name: &str,
) -> Result<PathBuf> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..TokenRequestSpec::default() }),
        ..TokenRequest::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token of ServiceAccount {namespace}/{name}"))?;
    let token = answer.status.and_then(|s| s.token).context("no token in the TokenRequest status")?;
    let mut config = kube::config::Kubeconfig::read_from(env.kubeconfig_path())?;
    for user in &mut config.auth_infos {
        user.auth_info =
            Some(kube::config::AuthInfo { token: Some(token.clone().into()), ..Default::default() });
    }
    let path = env.workdir().join(file_name);
    // JSON is YAML: kube reads it back.
    std::fs::write(&path, serde_json::to_vec(&config)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// [`apply_rbac_manifest`], then [`token_kubeconfig`] for its ServiceAccount: a kubeconfig with exactly the
/// permissions the component's deploy manifest grants.
pub async fn manifest_kubeconfig(
    env: &TestEnv,
    client: &kube::Client,
    manifest: &Path,
    file_name: &str,
) -> Result<PathBuf> {
    let (namespace, name) = apply_rbac_manifest(client, manifest).await?;
    token_kubeconfig(env, client, (&namespace, &name), file_name).await
}
