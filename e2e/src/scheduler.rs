//! `KubeSchedulerConfiguration` for kube-scheduler with the vgpu extender.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// Name of the scheduler profile that calls the extender (`spec.schedulerName` of vGPU pods).
pub const SCHEDULER_NAME: &str = "vgpu-scheduler";

/// Extended resources the vgpu extender manages.
pub const VGPU_RESOURCES: [&str; 3] =
    ["nvidia.com/vgpu-number", "nvidia.com/vgpu-cores", "nvidia.com/vgpu-memory"];

/// The `extenders:` entry of the scheduler configuration (`kubescheduler.config.k8s.io/v1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtenderConfig {
    /// `urlPrefix`, e.g. `http://127.0.0.1:3456/scheduler`; verbs are appended as `/<verb>`.
    pub url_prefix: String,
    /// `filterVerb` (`None`: not called).
    pub filter_verb: Option<String>,
    /// `prioritizeVerb`.
    pub prioritize_verb: Option<String>,
    /// `bindVerb` (the extender then binds pods itself).
    pub bind_verb: Option<String>,
    /// `preemptVerb`.
    pub preempt_verb: Option<String>,
    /// `weight` for prioritize scores.
    pub weight: i64,
    /// `nodeCacheCapable`: send `NodeNames` instead of full nodes.
    pub node_cache_capable: bool,
    /// `managedResources`: `(name, ignoredByScheduler)`.
    pub managed_resources: Vec<(String, bool)>,
    /// `httpTimeout`, a Go duration such as `10s`.
    pub http_timeout: String,
    /// `ignorable`: scheduling goes on when the extender fails.
    pub ignorable: bool,
    /// `enableHTTPS` with `tlsConfig.caFile`: the CA that signed the extender's serving certificate
    /// (`urlPrefix` is then `https://…`). kube-scheduler's Go client negotiates HTTP/2 over TLS.
    pub tls_ca_file: Option<PathBuf>,
}

impl ExtenderConfig {
    /// The vgpu extender at `url_prefix`: verbs `filter`, `prioritize`, `bind`, `preempt`,
    /// `nodeCacheCapable`, the three vGPU resources managed as the vgpu-manager chart sets them
    /// (`vgpu-number` with `ignoredByScheduler: false`, so in-tree preemption sees count pressure;
    /// `vgpu-cores` and `vgpu-memory` with `ignoredByScheduler: true`), `weight: 1`, `httpTimeout: 30s`,
    /// `ignorable: false`.
    pub fn vgpu(url_prefix: impl Into<String>) -> Self {
        Self {
            url_prefix: url_prefix.into(),
            filter_verb: Some("filter".to_owned()),
            prioritize_verb: Some("prioritize".to_owned()),
            bind_verb: Some("bind".to_owned()),
            preempt_verb: Some("preempt".to_owned()),
            weight: 1,
            node_cache_capable: true,
            managed_resources: VGPU_RESOURCES
                .iter()
                .map(|r| ((*r).to_owned(), *r != VGPU_RESOURCES[0]))
                .collect(),
            http_timeout: "30s".to_owned(),
            ignorable: false,
            tls_ca_file: None,
        }
    }

    /// This entry over HTTPS: the extender's serving certificate is verified against the CA in `ca_file`.
    pub fn with_tls_ca(mut self, ca_file: impl Into<PathBuf>) -> Self {
        self.tls_ca_file = Some(ca_file.into());
        self
    }

    /// This entry as JSON (the keys of the Go `Extender` type).
    pub fn to_json(&self) -> Value {
        let mut entry = json!({
            "urlPrefix": self.url_prefix,
            "weight": self.weight,
            "nodeCacheCapable": self.node_cache_capable,
            "httpTimeout": self.http_timeout,
            "ignorable": self.ignorable,
            "enableHTTPS": self.tls_ca_file.is_some(),
            "managedResources": self.managed_resources.iter()
                .map(|(name, ignored)| json!({"name": name, "ignoredByScheduler": ignored}))
                .collect::<Vec<_>>(),
        });
        if let (Some(ca), Some(map)) = (&self.tls_ca_file, entry.as_object_mut()) {
            map.insert("tlsConfig".to_owned(), json!({"caFile": ca.display().to_string()}));
        }
        for (key, verb) in [
            ("filterVerb", &self.filter_verb),
            ("prioritizeVerb", &self.prioritize_verb),
            ("bindVerb", &self.bind_verb),
            ("preemptVerb", &self.preempt_verb),
        ] {
            if let (Some(verb), Some(map)) = (verb, entry.as_object_mut()) {
                map.insert(key.to_owned(), Value::String(verb.clone()));
            }
        }
        entry
    }
}

/// A `KubeSchedulerConfiguration` (JSON, which kube-scheduler reads like YAML) with one
/// profile, [`SCHEDULER_NAME`], no leader election, and the given extenders.
pub fn scheduler_configuration(kubeconfig: &Path, extenders: &[ExtenderConfig]) -> Value {
    json!({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": false},
        "clientConnection": {"kubeconfig": kubeconfig.display().to_string(), "qps": 100, "burst": 200},
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
        "extenders": extenders.iter().map(ExtenderConfig::to_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vgpu_extender_entry_has_the_contract_keys() {
        let cfg = scheduler_configuration(
            Path::new("/tmp/kubeconfig"),
            &[ExtenderConfig::vgpu("http://127.0.0.1:1/scheduler")],
        );
        assert_eq!(cfg["apiVersion"], "kubescheduler.config.k8s.io/v1");
        assert_eq!(cfg["profiles"][0]["schedulerName"], SCHEDULER_NAME);
        let ext = &cfg["extenders"][0];
        assert_eq!(ext["urlPrefix"], "http://127.0.0.1:1/scheduler");
        assert_eq!(ext["filterVerb"], "filter");
        assert_eq!(ext["prioritizeVerb"], "prioritize");
        assert_eq!(ext["bindVerb"], "bind");
        assert_eq!(ext["preemptVerb"], "preempt");
        assert_eq!(ext["nodeCacheCapable"], true);
        assert_eq!(ext["weight"], 1);
        assert_eq!(ext["httpTimeout"], "30s");
        assert_eq!(ext["ignorable"], false);
        assert_eq!(ext["enableHTTPS"], false);
        assert!(ext.get("tlsConfig").is_none());
        let managed = ext["managedResources"].as_array().unwrap();
        assert_eq!(managed.len(), 3);
        for (entry, name) in managed.iter().zip(VGPU_RESOURCES) {
            assert_eq!(entry["name"], name);
            assert_eq!(entry["ignoredByScheduler"], name != "nvidia.com/vgpu-number", "{name}");
        }
    }

    #[test]
    fn absent_verbs_are_omitted() {
        let mut ext = ExtenderConfig::vgpu("http://127.0.0.1:1");
        ext.prioritize_verb = None;
        let json = ext.to_json();
        assert!(json.get("prioritizeVerb").is_none());
        assert_eq!(json["filterVerb"], "filter");
    }

    #[test]
    fn https_entry_names_the_ca() {
        let json = ExtenderConfig::vgpu("https://127.0.0.1:1/scheduler").with_tls_ca("/pki/ca.crt").to_json();
        assert_eq!(json["enableHTTPS"], true);
        assert_eq!(json["tlsConfig"], json!({"caFile": "/pki/ca.crt"}));
    }
}
