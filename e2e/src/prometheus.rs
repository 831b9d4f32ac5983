//! A real Prometheus server (Debian package `prometheus`; `.ci/run` installs it) scraping our metrics
//! endpoints on loopback every second, and its HTTP query API.
//!
//! ```no_run
//! # async fn demo(env: &mut vgpu_e2e::TestEnv, monitor_port: u16) -> anyhow::Result<()> {
//! let Some(prometheus) = vgpu_e2e::prometheus::Prometheus::start(env, &[monitor_port])? else {
//!     return Ok(()); // not installed: the caller says it skipped
//! };
//! let series = prometheus.query("up").await;
//! # let _ = series;
//! # Ok(())
//! # }
//! ```

use anyhow::{Context, Result};

use crate::{TestEnv, free_port, http_get};

/// The process name of the server in its [`TestEnv`] (its log is `prometheus.log`).
pub const PROCESS: &str = "prometheus";

/// A Prometheus server started by [`Prometheus::start`]; stopped with its environment.
#[derive(Debug, Clone, Copy)]
pub struct Prometheus {
    port: u16,
}

impl Prometheus {
    /// Starts Prometheus in `env` with one job, `vgpu-monitor`, scraping `127.0.0.1:<port>` for each of
    /// `targets` every second. `Ok(None)` when `prometheus` is not on `PATH`.
    pub fn start(env: &mut TestEnv, targets: &[u16]) -> Result<Option<Self>> {
        let Some(program) = which("prometheus") else { return Ok(None) };
        let dir = env.workdir().join("prometheus");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let targets: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nscrape_configs:\n  - job_name: vgpu-monitor\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        let port = free_port()?;
        let args = vec![
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ];
        env.start_process(PROCESS, &program, &args, &[])?;
        Ok(Some(Self { port }))
    }

    /// The series of an instant query as `(labels, value)`; `None` while the server does not answer 200.
    pub async fn query(&self, query: &str) -> Option<Vec<(serde_json::Value, f64)>> {
        let (status, body) =
            http_get(self.port, &format!("/api/v1/query?query={}", encode_query(query))).await.ok()?;
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        let result = v["data"]["result"].as_array()?;
        Some(
            result
                .iter()
                .filter_map(|r| Some((r["metric"].clone(), r["value"][1].as_str()?.parse().ok()?)))
                .collect(),
        )
    }
}

/// `q` percent-encoded for a URL query value.
fn encode_query(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The first `name` on `PATH`.
fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(encode_query(r#"up{job="a b"}"#), "up%7Bjob%3D%22a%20b%22%7D");
    }
}
