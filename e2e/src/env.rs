//! [`TestEnv`]: etcd + kube-apiserver (+ kube-scheduler) on loopback.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

use crate::binaries::Binaries;
use crate::certs;
use crate::net::{free_ports, host_address, wait_for_port};
use crate::process::{ManagedProcess, log_tail};
use crate::scheduler::{ExtenderConfig, scheduler_configuration};

/// Feature gates enabled on kube-apiserver by default (the DRA tests need them).
///
/// In v1.37 `DRAConsumableCapacity` is beta (on by default; set explicitly so a default change
/// does not silently alter the tests). `DRADeviceTaints` is GA and locked on: setting it only
/// logs a warning and would fail once the gate is removed, so it is not set.
pub const DEFAULT_FEATURE_GATES: [&str; 1] = ["DRAConsumableCapacity=true"];
/// `--runtime-config` entries enabled by default: the `resource.k8s.io` beta APIs
/// (`v1` is on by default).
pub const DEFAULT_RUNTIME_CONFIG: [&str; 2] =
    ["resource.k8s.io/v1beta1=true", "resource.k8s.io/v1beta2=true"];
/// Environment variable: when `1`, logs are kept in `target/e2e-logs/<test>/` even on success.
pub const KEEP_LOGS_ENV: &str = "VGPU_E2E_KEEP_LOGS";

const ETCD_START_TIMEOUT: Duration = Duration::from_secs(30);
/// The processes [`TestEnv`] starts itself (their logs are not part of [`TestEnv::poll`]'s errors).
const CONTROL_PLANE: [&str; 4] = ["etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"];
/// Pause between two calls of [`TestEnv::poll`]'s function.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
const SCHEDULER_START_TIMEOUT: Duration = Duration::from_secs(60);
const READYZ_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Configures and starts a [`TestEnv`].
#[derive(Debug, Clone)]
pub struct TestEnvBuilder {
    name: String,
    feature_gates: Vec<String>,
    runtime_config: Vec<String>,
    apiserver_args: Vec<String>,
    ready_timeout: Duration,
    binaries: Option<Binaries>,
    cluster_services: bool,
}

impl TestEnvBuilder {
    /// Runs the control plane as a cluster whose pods use it, for charts installed on a real node:
    /// kube-apiserver listens on every address and advertises this host's (the `kubernetes` Service's
    /// endpoint, kept by the lease reconciler; its certificate names that address), pods get service
    /// account tokens (the `ServiceAccount` admission plugin), webhook and aggregated API calls go to a
    /// Service's endpoints (`--enable-aggregator-routing`: no kube-proxy runs beside the API server), and
    /// kube-controller-manager runs (DaemonSets, Deployments, the garbage collector, service accounts
    /// and tokens, `kube-root-ca.crt`).
    pub fn cluster_services(mut self) -> Self {
        self.cluster_services = true;
        self
    }

    /// Adds (or overrides) a kube-apiserver feature gate.
    pub fn feature_gate(mut self, name: &str, enabled: bool) -> Self {
        let prefix = format!("{name}=");
        self.feature_gates.retain(|g| !g.starts_with(&prefix));
        self.feature_gates.push(format!("{name}={enabled}"));
        self
    }

    /// Adds a `--runtime-config` entry such as `resource.k8s.io/v1alpha3=true`.
    pub fn runtime_config(mut self, entry: impl Into<String>) -> Self {
        self.runtime_config.push(entry.into());
        self
    }

    /// Appends a raw kube-apiserver argument (later flags win).
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// How long to wait for `/readyz` (default 120 s: the machines are small).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Uses these binaries instead of [`Binaries::locate`].
    pub fn binaries(mut self, binaries: Binaries) -> Self {
        self.binaries = Some(binaries);
        self
    }

    /// Starts etcd and kube-apiserver and waits until the API server is ready.
    pub async fn start(self) -> Result<TestEnv> {
        let binaries = match self.binaries.clone() {
            Some(b) => b,
            None => Binaries::locate()?,
        };
        let dir = tempfile::Builder::new()
            .prefix("vgpu-e2e-")
            .tempdir()
            .context("creating the environment folder")?;
        let [etcd_port, etcd_peer_port, api_port] =
            free_ports(3)?.try_into().map_err(|_| anyhow::anyhow!("free_ports returned a wrong count"))?;
        let host_address = if self.cluster_services { Some(host_address()?) } else { None };
        let mut env = TestEnv {
            name: self.name.clone(),
            binaries,
            processes: Vec::new(),
            host_address,
            api_port,
            kubeconfig: dir.path().join("kubeconfig"),
            token: random_token(),
            finished: false,
            dir,
        };
        env.write_credentials()?;
        env.start_etcd(etcd_port, etcd_peer_port).await?;
        env.start_apiserver(&self, etcd_port)?;
        env.wait_ready(self.ready_timeout).await?;
        if self.cluster_services {
            env.start_controller_manager()?;
        }
        Ok(env)
    }
}

/// A running control plane; see the [crate docs](crate).
///
/// Dropping it stops every process (SIGTERM, then SIGKILL after 5 s, to the whole process
/// group) and removes its temporary folder. Unless [`TestEnv::finish`] was called (or when
/// `VGPU_E2E_KEEP_LOGS=1`), the logs and configuration files are first copied to
/// `target/e2e-logs/<name>/`.
#[derive(Debug)]
pub struct TestEnv {
    name: String,
    binaries: Binaries,
    processes: Vec<ManagedProcess>,
    /// This host's address, advertised by kube-apiserver ([`TestEnvBuilder::cluster_services`]).
    host_address: Option<Ipv4Addr>,
    api_port: u16,
    kubeconfig: PathBuf,
    token: String,
    finished: bool,
    // Last: removed after the processes are stopped and the logs copied.
    dir: tempfile::TempDir,
}

impl TestEnv {
    /// A builder with the default feature gates and runtime config. `name` (usually the test
    /// function's name) names the log folder.
    pub fn builder(name: impl Into<String>) -> TestEnvBuilder {
        TestEnvBuilder {
            name: name.into(),
            feature_gates: DEFAULT_FEATURE_GATES.iter().map(|s| (*s).to_owned()).collect(),
            runtime_config: DEFAULT_RUNTIME_CONFIG.iter().map(|s| (*s).to_owned()).collect(),
            apiserver_args: Vec::new(),
            ready_timeout: Duration::from_secs(120),
            binaries: None,
            cluster_services: false,
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn api_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// The address pods reach the API server on (this host's, advertised as the `kubernetes` Service's
    /// endpoint); `None` unless started with [`TestEnvBuilder::cluster_services`].
    pub fn host_address(&self) -> Option<Ipv4Addr> {
        self.host_address
    }

    /// The admin kubeconfig (static token, `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Files for a server of ours on loopback that kube-scheduler or kube-apiserver call over HTTPS: the API
    /// server's own serving certificate and key (for `localhost` and `127.0.0.1`) and the CA that signed it
    /// (`(tls.crt, tls.key, ca.crt)`).
    pub fn loopback_tls_files(&self) -> (PathBuf, PathBuf, PathBuf) {
        let file = |name: &str| self.dir.path().join(name);
        (file("apiserver.crt"), file("apiserver.key"), file("ca.crt"))
    }

    /// The temporary folder holding certificates, data and logs.
    pub fn workdir(&self) -> &Path {
        self.dir.path()
    }

    /// The log file of a component (`etcd`, `kube-apiserver`, `kube-scheduler`).
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir.path().join(format!("{component}.log"))
    }

    /// The binaries in use.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// A new admin client from the kubeconfig.
    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Starts kube-scheduler with one profile, [`crate::SCHEDULER_NAME`], calling `extender`.
    pub async fn start_scheduler(&mut self, extender: &ExtenderConfig) -> Result<()> {
        let config = scheduler_configuration(&self.kubeconfig, std::slice::from_ref(extender));
        self.start_scheduler_with_config(&config).await
    }

    /// Starts kube-scheduler with a full `KubeSchedulerConfiguration` (JSON) and waits until
    /// it serves its health port.
    pub async fn start_scheduler_with_config(&mut self, config: &serde_json::Value) -> Result<()> {
        if self.processes.iter().any(|p| p.name() == "kube-scheduler") {
            bail!("kube-scheduler is already running");
        }
        let config_path = self.dir.path().join("scheduler-config.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(config)?)?;
        let [port] =
            free_ports(1)?.try_into().map_err(|_| anyhow::anyhow!("free_ports returned a wrong count"))?;
        let kubeconfig = self.kubeconfig.display().to_string();
        let args = vec![
            format!("--config={}", config_path.display()),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", self.dir.path().join("scheduler-certs").display()),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--v=2".to_owned(),
        ];
        let index = self.spawn("kube-scheduler", &args)?;
        let process = &mut self.processes[index];
        wait_for_port(port, SCHEDULER_START_TIMEOUT, || process.check_running())
            .await
            .context("waiting for kube-scheduler")
    }

    /// Starts one of our binaries (see [`crate::vgpu_binary`]) as a managed process named `name` (unique in
    /// this environment; its log is `<name>.log`, appended to across restarts) with `args` and extra
    /// environment variables. Stopped with the environment, or earlier with [`TestEnv::stop_process`] /
    /// [`TestEnv::kill_process`].
    pub fn start_process(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<()> {
        if self.processes.iter().any(|p| p.name() == name) {
            bail!("a process named {name} is already running");
        }
        let process = ManagedProcess::spawn_with_env(name, program, args, env, &self.log_path(name))?;
        self.processes.push(process);
        Ok(())
    }

    /// [`TestEnv::start_process`] in the working directory `cwd` (e.g. `nfd-worker`, which reads
    /// `features.d/` relative to it: [`crate::nfd`]).
    pub fn start_process_in(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        cwd: &Path,
    ) -> Result<()> {
        if self.processes.iter().any(|p| p.name() == name) {
            bail!("a process named {name} is already running");
        }
        let process = ManagedProcess::spawn_in(name, program, args, env, Some(cwd), &self.log_path(name))?;
        self.processes.push(process);
        Ok(())
    }

    /// Fails (with the end of its log) if the named process is not running.
    pub fn check_process(&mut self, name: &str) -> Result<()> {
        match self.processes.iter_mut().find(|p| p.name() == name) {
            Some(p) => p.check_running(),
            None => bail!("no process named {name}"),
        }
    }

    /// Stops the named process gracefully (SIGTERM, then SIGKILL after 5 s) and forgets it.
    pub fn stop_process(&mut self, name: &str) -> Result<()> {
        let index = self.process_index(name)?;
        let mut p = self.processes.remove(index);
        p.stop();
        Ok(())
    }

    /// Kills the named process with SIGKILL (no clean-up can run) and forgets it.
    pub fn kill_process(&mut self, name: &str) -> Result<()> {
        let index = self.process_index(name)?;
        let mut p = self.processes.remove(index);
        p.kill();
        Ok(())
    }

    fn process_index(&self, name: &str) -> Result<usize> {
        self.processes
            .iter()
            .position(|p| p.name() == name)
            .with_context(|| format!("no process named {name}"))
    }

    /// CPU seconds (user + system) each running process of this environment has used so far, by name
    /// (`etcd`, `kube-apiserver`, `kube-scheduler` and those of [`start_process`](Self::start_process)).
    pub fn cpu_seconds(&self) -> Vec<(String, f64)> {
        self.processes.iter().filter_map(|p| Some((p.name().to_owned(), p.cpu_seconds()?))).collect()
    }

    /// The end of a component's log (for assertion messages).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        log_tail(&self.log_path(component), lines)
    }

    /// Calls `f` every 250 ms until it returns `Some`, and returns that value; after `timeout`, fails
    /// naming `what`, with the last 30 log lines of each process started by [`TestEnv::start_process`]
    /// (the control plane's own logs are kept in `target/e2e-logs/` when the test does not finish).
    pub async fn poll<T, F, Fut>(&self, what: &str, timeout: Duration, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(value) = f().await {
                return Ok(value);
            }
            if tokio::time::Instant::now() >= deadline {
                let logs: String = self
                    .processes
                    .iter()
                    .filter(|p| !CONTROL_PLANE.contains(&p.name()))
                    .map(|p| format!("\n--- {} log:\n{}", p.name(), self.log_tail(p.name(), 30)))
                    .collect();
                bail!("{what}: not after {timeout:?}{logs}");
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Marks the test as passed: the logs are not kept. Then stops everything.
    pub fn finish(mut self) {
        self.finished = true;
    }

    fn spawn(&mut self, name: &str, args: &[String]) -> Result<usize> {
        let program = match name {
            "etcd" => &self.binaries.etcd,
            "kube-apiserver" => &self.binaries.kube_apiserver,
            "kube-scheduler" => &self.binaries.kube_scheduler,
            "kube-controller-manager" => &self.binaries.kube_controller_manager,
            other => bail!("unknown component {other}"),
        };
        let process = ManagedProcess::spawn(name, program, args, &self.log_path(name))?;
        self.processes.push(process);
        Ok(self.processes.len() - 1)
    }

    fn write_credentials(&self) -> Result<()> {
        let pki = certs::generate(self.host_address.as_slice())?;
        let dir = self.dir.path();
        for (file, content) in [
            ("ca.crt", &pki.ca_cert),
            ("apiserver.crt", &pki.serving_cert),
            ("apiserver.key", &pki.serving_key),
            ("sa.key", &pki.sa_private_key),
            ("sa.pub", &pki.sa_public_key),
        ] {
            std::fs::write(dir.join(file), content).with_context(|| format!("writing {file}"))?;
        }
        // token,user,uid,"group,..."
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{},admin,admin-uid,\"system:masters\"\n", self.token),
        )?;
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {
                "server": self.api_url(),
                "certificate-authority": dir.join("ca.crt").display().to_string(),
            }}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin", "namespace": "default"}}],
            "current-context": "e2e",
        });
        std::fs::write(&self.kubeconfig, serde_json::to_vec_pretty(&kubeconfig)?)?;
        Ok(())
    }

    async fn start_etcd(&mut self, port: u16, peer_port: u16) -> Result<()> {
        let client_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let args = vec![
            "--name=e2e".to_owned(),
            format!("--data-dir={}", self.dir.path().join("etcd-data").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=e2e={peer_url}"),
            // Throw-away data: no fsync, much faster on shared disks.
            "--unsafe-no-fsync=true".to_owned(),
        ];
        let index = self.spawn("etcd", &args)?;
        let process = &mut self.processes[index];
        wait_for_port(port, ETCD_START_TIMEOUT, || process.check_running()).await.context("waiting for etcd")
    }

    fn start_apiserver(&mut self, builder: &TestEnvBuilder, etcd_port: u16) -> Result<()> {
        let dir = self.dir.path();
        let file = |name: &str| dir.join(name).display().to_string();
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            format!("--bind-address={}", if self.host_address.is_some() { "0.0.0.0" } else { "127.0.0.1" }),
            format!("--advertise-address={}", self.host_address.unwrap_or(Ipv4Addr::LOCALHOST)),
            format!("--secure-port={}", self.api_port),
            format!("--cert-dir={}", file("apiserver-certs")),
            format!("--tls-cert-file={}", file("apiserver.crt")),
            format!("--tls-private-key-file={}", file("apiserver.key")),
            format!("--client-ca-file={}", file("ca.crt")),
            format!("--token-auth-file={}", file("tokens.csv")),
            "--authorization-mode=RBAC".to_owned(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
            format!("--service-account-key-file={}", file("sa.pub")),
            format!("--service-account-signing-key-file={}", file("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--allow-privileged=true".to_owned(),
        ];
        if self.host_address.is_some() {
            args.push("--enable-aggregator-routing=true".to_owned());
            // kube-controller-manager runs and creates the service accounts; nothing lifts the
            // `node.kubernetes.io/not-ready` taint TaintNodesByCondition puts on a new node before
            // its kubelet reports (the node lifecycle controller would, later).
            args.push("--disable-admission-plugins=TaintNodesByCondition".to_owned());
        } else {
            // The default (lease) reconciler rejects a loopback advertise address.
            args.push("--endpoint-reconciler-type=none".to_owned());
            // No kube-controller-manager runs: nothing would create the `default` service
            // accounts, nor lift the `node.kubernetes.io/not-ready` taint that
            // TaintNodesByCondition puts on new nodes.
            args.push("--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".to_owned());
        }
        if !builder.feature_gates.is_empty() {
            args.push(format!("--feature-gates={}", builder.feature_gates.join(",")));
        }
        if !builder.runtime_config.is_empty() {
            args.push(format!("--runtime-config={}", builder.runtime_config.join(",")));
        }
        args.extend(builder.apiserver_args.iter().cloned());
        self.spawn("kube-apiserver", &args)?;
        Ok(())
    }

    /// kube-controller-manager with the admin kubeconfig (no leader election, no serving port): every
    /// default controller, signing service-account tokens with the API server's key and publishing its CA.
    fn start_controller_manager(&mut self) -> Result<()> {
        let dir = self.dir.path();
        let file = |name: &str| dir.join(name).display().to_string();
        let kubeconfig = self.kubeconfig.display().to_string();
        let args = vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--secure-port=0".to_owned(),
            "--leader-elect=false".to_owned(),
            "--use-service-account-credentials=false".to_owned(),
            format!("--service-account-private-key-file={}", file("sa.key")),
            format!("--root-ca-file={}", file("ca.crt")),
            // Pod CIDRs are the real node's own (its CNI configuration).
            "--controllers=*,-node-ipam-controller".to_owned(),
            "--v=2".to_owned(),
        ];
        self.spawn("kube-controller-manager", &args)?;
        Ok(())
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let client = self.client().await?;
        let deadline = Instant::now() + timeout;
        loop {
            for process in &mut self.processes {
                process.check_running()?;
            }
            let request = http::Request::get("/readyz").body(Vec::new())?;
            let last = match tokio::time::timeout(READYZ_REQUEST_TIMEOUT, client.request_text(request)).await
            {
                Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                Ok(Ok(body)) => body,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "request timed out".to_owned(),
            };
            if Instant::now() >= deadline {
                bail!(
                    "kube-apiserver not ready after {timeout:?}: {last}\nlast log lines:\n{}",
                    log_tail(&self.log_path("kube-apiserver"), 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `target/e2e-logs/<name>` (`$CARGO_TARGET_DIR` is honoured).
    fn logs_dest(&self) -> PathBuf {
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
        };
        target.join("e2e-logs").join(sanitize(&self.name))
    }

    fn keep_logs(&self) -> Result<PathBuf> {
        let dest = self.logs_dest();
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::create_dir_all(&dest)?;
        for entry in std::fs::read_dir(self.dir.path())? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let wanted = name.ends_with(".log") || name.ends_with(".json") || name == "kubeconfig";
            if wanted && path.is_file() {
                std::fs::copy(&path, dest.join(name))?;
            }
        }
        Ok(dest)
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        while let Some(mut process) = self.processes.pop() {
            process.stop();
        }
        let failed = !self.finished || std::thread::panicking();
        let keep = std::env::var(KEEP_LOGS_ENV).is_ok_and(|v| v == "1");
        if !failed && !keep {
            // Logs of an earlier failed run would only mislead.
            let _ = std::fs::remove_dir_all(self.logs_dest());
        }
        if failed || keep {
            match self.keep_logs() {
                Ok(dest) => eprintln!("vgpu-e2e [{}]: logs kept in {}", self.name, dest.display()),
                Err(e) => eprintln!("vgpu-e2e [{}]: could not keep the logs: {e}", self.name),
            }
        }
    }
}

fn random_token() -> String {
    let state = RandomState::new();
    let mut hasher = state.build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    let a = hasher.finish();
    hasher.write_u64(a);
    format!("vgpu-e2e-{a:016x}{:016x}", hasher.finish())
}

fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_gates_override() {
        let b = TestEnv::builder("t").feature_gate("DRADeviceTaints", false).feature_gate("Foo", true);
        assert_eq!(b.feature_gates, vec!["DRAConsumableCapacity=true", "DRADeviceTaints=false", "Foo=true"]);
    }

    #[test]
    fn tokens_differ_and_names_are_sanitized() {
        assert_ne!(random_token(), random_token());
        assert_eq!(sanitize("a::b c/d-e_f"), "a__b_c_d-e_f");
    }

    #[tokio::test]
    async fn missing_binaries_fail_start_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let bins = Binaries {
            etcd: dir.path().join("etcd"),
            kube_apiserver: dir.path().join("kube-apiserver"),
            kube_scheduler: dir.path().join("kube-scheduler"),
            kube_controller_manager: dir.path().join("kube-controller-manager"),
        };
        let err = TestEnv::builder("unit_test_missing_binaries").binaries(bins).start().await.unwrap_err();
        assert!(format!("{err:#}").contains("starting etcd"), "{err:#}");
    }
}
