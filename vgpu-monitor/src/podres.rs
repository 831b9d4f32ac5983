//! Which container holds which MIG device, for `container_mig_device_allocation_info` (contract §8): the
//! kubelet's pod-resources API `v1` (`PodResourcesLister.List`), the only place a MIG instance handed out by
//! the device plugin's MIG plugins is tied to a container (the MIG plugins set no annotation and write no
//! `vgpu.config`).
//!
//! | impl | what it holds | refreshed |
//! |---|---|---|
//! | [`KubeletPodResources`] | the last answer of `List` on the kubelet socket (`/var/lib/kubelet/pod-resources/kubelet.sock`, `--pod-resources-socket`), called through [`vgpu_kubelet::podresources::list_pod_resources`] | every `interval` in a background task; a failed call keeps the last answer (logged once until it works again) |
//! | [`InMemoryPodResources`] | whatever [`InMemoryPodResources::set`] stored | – |
//!
//! A MIG device is allocated to a container when the container's device entry of the instance's resource
//! (`<domain>/mig-<profile>`, `+` → `.`: the MIG plugin's resource, `ResourceDomain::mig_resource`) lists the
//! MIG UUID ([`mig_holders`]).

use std::{
    path::PathBuf,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use vgpu_kubelet::{api::podresources::PodResources, podresources::list_pod_resources};

/// The kubelet's view of which container holds which device.
pub trait PodResourcesSource: Send + Sync + std::fmt::Debug {
    /// The pods and their containers' devices (a snapshot).
    fn pod_resources(&self) -> Arc<Vec<PodResources>>;
}

/// An in-memory [`PodResourcesSource`].
#[derive(Debug, Default)]
pub struct InMemoryPodResources {
    pods: RwLock<Arc<Vec<PodResources>>>,
}

impl InMemoryPodResources {
    /// A source holding `pods`.
    pub fn new(pods: Vec<PodResources>) -> Self {
        Self { pods: RwLock::new(Arc::new(pods)) }
    }

    /// Replaces the pods.
    pub fn set(&self, pods: Vec<PodResources>) {
        *self.pods.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(pods);
    }
}

impl PodResourcesSource for InMemoryPodResources {
    fn pod_resources(&self) -> Arc<Vec<PodResources>> {
        Arc::clone(&self.pods.read().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A cache of the kubelet's pod-resources `List`, refreshed in the background.
#[derive(Debug, Clone)]
pub struct KubeletPodResources {
    socket: PathBuf,
    cache: Arc<InMemoryPodResources>,
}

impl KubeletPodResources {
    /// Starts refreshing from `socket` every `interval` (each call limited to `timeout`) on the current
    /// tokio runtime, until the runtime stops. The first call happens at once.
    pub fn start(socket: PathBuf, interval: Duration, timeout: Duration) -> Self {
        let cache = Arc::new(InMemoryPodResources::default());
        let (task_socket, task_cache) = (socket.clone(), Arc::clone(&cache));
        tokio::spawn(async move {
            let mut failing = false;
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match list_pod_resources(&task_socket, timeout).await {
                    Ok(pods) => {
                        if std::mem::take(&mut failing) {
                            tracing::info!(socket = %task_socket.display(), "kubelet pod-resources API answers again");
                        }
                        task_cache.set(pods);
                    }
                    Err(err) if !failing => {
                        failing = true;
                        tracing::warn!(%err, "kubelet pod-resources API unavailable: container_mig_device_allocation_info keeps its last answer");
                    }
                    Err(err) => tracing::debug!(%err, "kubelet pod-resources API still unavailable"),
                }
            }
        });
        Self { socket, cache }
    }

    /// The socket.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }
}

impl PodResourcesSource for KubeletPodResources {
    fn pod_resources(&self) -> Arc<Vec<PodResources>> {
        self.cache.pod_resources()
    }
}

/// `(namespace, pod, container)` of every container holding MIG device `mig_uuid` through `resource`
/// (`<domain>/mig-<profile>`).
pub fn mig_holders<'a>(
    pods: &'a [PodResources],
    resource: &'a str,
    mig_uuid: &'a str,
) -> impl Iterator<Item = (&'a str, &'a str, &'a str)> + 'a {
    pods.iter().flat_map(move |p| {
        p.containers
            .iter()
            .filter(move |c| {
                c.devices
                    .iter()
                    .any(|d| d.resource_name == resource && d.device_ids.iter().any(|id| id == mig_uuid))
            })
            .map(move |c| (p.namespace.as_str(), p.name.as_str(), c.name.as_str()))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use vgpu_kubelet::api::podresources::{ContainerDevices, ContainerResources};

    use super::*;

    fn pod(ns: &str, name: &str, containers: &[(&str, &str, &[&str])]) -> PodResources {
        PodResources {
            namespace: ns.into(),
            name: name.into(),
            containers: containers
                .iter()
                .map(|(c, resource, ids)| ContainerResources {
                    name: (*c).into(),
                    devices: vec![ContainerDevices {
                        resource_name: (*resource).into(),
                        device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                        topology: None,
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn holders_need_the_instances_resource_listing_the_uuid() {
        let pods = [
            pod("ns", "a", &[("main", "nvidia.com/mig-1g.10gb", &["MIG-1", "MIG-2"])]),
            // The same UUID under a non-MIG resource does not count.
            pod("ns", "b", &[("main", "nvidia.com/vgpu-number", &["MIG-1"])]),
            pod(
                "ns",
                "c",
                &[("x", "nvidia.com/mig-3g.40gb", &["MIG-3"]), ("y", "nvidia.com/mig-1g.10gb", &["MIG-2"])],
            ),
        ];
        let one_g = "nvidia.com/mig-1g.10gb";
        let h: Vec<_> = mig_holders(&pods, one_g, "MIG-1").collect();
        assert_eq!(h, [("ns", "a", "main")]);
        let h: Vec<_> = mig_holders(&pods, one_g, "MIG-2").collect();
        assert_eq!(h, [("ns", "a", "main"), ("ns", "c", "y")]);
        assert_eq!(mig_holders(&pods, one_g, "MIG-9").count(), 0);
        assert_eq!(mig_holders(&pods, "nvidia.com/mig-3g.40gb", "MIG-1").count(), 0);
        assert_eq!(mig_holders(&pods, "example.com/mig-1g.10gb", "MIG-1").count(), 0);
    }
}
