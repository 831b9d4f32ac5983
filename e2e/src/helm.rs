//! Helm charts against the real API server: find the Helm binary, render a chart (`helm template`), apply
//! CRDs for real and every other rendered object as a server-side dry-run.
//!
//! | step | how |
//! |---|---|
//! | Helm | `$VGPU_HELM` (CI's charts step), else `${VGPU_E2E_CACHE:-${XDG_CACHE_HOME:-~/.cache}/vgpu-e2e}/helm-v3.22.0/helm` ( where `e2e/build-helm.sh` puts it) |
//! | render | `helm template <release> <chart> --kube-version 1.37.2 --namespace <ns> <args>`; the YAML stream parsed into one JSON value per object (empty documents dropped) |
//! | CRDs | created for real (`POST`), then polled until `Established` and served |
//! | objects | kind resolved by discovery per group/version/kind, `POST ...?dryRun=All` (namespaced kinds in the object's namespace, else the render's) |
//!
//! ```no_run
//! # async fn demo(env: &vgpu_e2e::TestEnv) -> anyhow::Result<()> {
//! use vgpu_e2e::helm;
//! let Some(helm_bin) = helm::locate_helm()? else { return Ok(()) }; // skipped, said on stderr
//! let objects = helm::template(&helm_bin, std::path::Path::new("charts/gpu-module"), "r", "ns", &[])?;
//! let client = env.client().await?;
//! for object in &objects {
//!     helm::create_dry_run(&client, object, "ns").await?;
//! }
//! # Ok(())
//! # }
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use serde_json::Value;

use crate::binaries::{CACHE_ENV, default_bin_dir};

/// The environment variable naming the Helm binary (set by CI's charts step, `.ci/run`).
pub const HELM_ENV: &str = "VGPU_HELM";

/// The Helm release `e2e/build-helm.sh` builds (`e2e/helm/go.mod`); its cache folder is `helm-<version>`.
pub const HELM_VERSION: &str = "v3.22.0";

/// The Kubernetes version the charts are rendered for (`--kube-version`), the control plane's.
pub const KUBE_VERSION: &str = "1.37.2";

/// Finds the Helm binary: `$VGPU_HELM` when set (an error if it is not an executable file), else the
/// cached build of `e2e/build-helm.sh`. `Ok(None)` when neither exists, after saying on stderr where it
/// looked and how to build it (so a skipping test is never silent).
pub fn locate_helm() -> Result<Option<PathBuf>> {
    if let Some(path) = std::env::var_os(HELM_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        if !is_executable(&path) {
            bail!("{HELM_ENV}={} is not an executable file (expected the Helm binary)", path.display());
        }
        return Ok(Some(path));
    }
    let cache = default_bin_dir()
        .and_then(|dir| dir.parent().map(Path::to_path_buf))
        .ok_or_else(|| anyhow!("neither {HELM_ENV}, {CACHE_ENV}, XDG_CACHE_HOME nor HOME is set"))?;
    let cached = cache.join(format!("helm-{HELM_VERSION}")).join("helm");
    if is_executable(&cached) {
        return Ok(Some(cached));
    }
    // Straight to the stderr handle, not `eprintln!`: the test harness captures the macros' output of
    // passing tests, and a skip must be seen.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: Helm not available: {HELM_ENV} is unset and {} does not exist; build it with e2e/build-helm.sh \
         (or set {HELM_ENV})",
        cached.display()
    );
    Ok(None)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Renders `chart` with `helm template <release> <chart> --kube-version 1.37.2 --namespace <namespace>
/// <args>` and returns the rendered objects (empty YAML documents dropped). A failing render is an error
/// with Helm's stderr.
pub fn template(
    helm: &Path,
    chart: &Path,
    release: &str,
    namespace: &str,
    args: &[String],
) -> Result<Vec<Value>> {
    let output = Command::new(helm)
        .arg("template")
        .arg(release)
        .arg(chart)
        .args(["--kube-version", KUBE_VERSION, "--namespace", namespace])
        .args(args)
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    if !output.status.success() {
        bail!(
            "helm template {} {args:?} failed ({}): {}",
            chart.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let text = String::from_utf8(output.stdout).context("helm template printed non-UTF-8")?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .with_context(|| format!("parsing the render of {}", chart.display()))?;
    Ok(docs.into_iter().filter(|d| d.as_object().is_some_and(|o| !o.is_empty())).collect())
}

/// Runs `helm <verb> <args> --kubeconfig <kubeconfig>` (for `install`, `upgrade` and `uninstall` against
/// the test API server) and returns its stdout; a failure is an error with Helm's stderr.
pub fn run(helm: &Path, kubeconfig: &Path, verb: &str, args: &[String]) -> Result<String> {
    let output = Command::new(helm)
        .arg(verb)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .with_context(|| format!("running {}", helm.display()))?;
    if !output.status.success() {
        bail!(
            "helm {verb} {args:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    String::from_utf8(output.stdout).with_context(|| format!("helm {verb} printed non-UTF-8"))
}

/// Reads the CustomResourceDefinitions of `files` (YAML, one or more documents each).
pub fn read_crds(files: &[PathBuf]) -> Result<Vec<CustomResourceDefinition>> {
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {}", file.display()))?;
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            crds.push(
                serde_json::from_value(doc)
                    .with_context(|| format!("{}: expected CustomResourceDefinitions", file.display()))?,
            );
        }
    }
    Ok(crds)
}

/// Creates `crds` for real and waits (up to `timeout`) until each is `Established` and its kind is found
/// by discovery.
pub async fn install_crds(
    client: &kube::Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), crd).await.with_context(|| format!("creating CRD {name}"))?;
    }
    let deadline = Instant::now() + timeout;
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let version = crd.spec.versions.iter().find(|v| v.served).map(|v| v.name.clone()).unwrap_or_default();
        let gvk = GroupVersionKind::gvk(&crd.spec.group, &version, &crd.spec.names.kind);
        loop {
            let established =
                api.get(&name).await.ok().and_then(|c| c.status).and_then(|s| s.conditions).is_some_and(
                    |conditions| conditions.iter().any(|c| c.type_ == "Established" && c.status == "True"),
                );
            if established && pinned_kind(client, &gvk).await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("CRD {name} not Established and served within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Creates `object` (a rendered manifest) with `?dryRun=All`: its kind is resolved by discovery; a
/// namespaced kind goes to `metadata.namespace`, else `namespace`. The error carries the API server's
/// message.
pub async fn create_dry_run(client: &kube::Client, object: &Value, namespace: &str) -> Result<()> {
    let api_version = object["apiVersion"].as_str().ok_or_else(|| anyhow!("object without apiVersion"))?;
    let kind = object["kind"].as_str().ok_or_else(|| anyhow!("object without kind"))?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("the API server does not serve {api_version} {kind}"))?;
    let dynamic: DynamicObject =
        serde_json::from_value(object.clone()).with_context(|| format!("{kind}: not a Kubernetes object"))?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = object["metadata"]["namespace"].as_str().unwrap_or(namespace);
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let params = PostParams { dry_run: true, field_manager: Some("vgpu-e2e".to_owned()) };
    api.create(&params, &dynamic).await.map(drop).map_err(|e| match e {
        kube::Error::Api(status) => anyhow!("{} ({}, code {})", status.message, status.reason, status.code),
        other => anyhow!(other),
    })
}
