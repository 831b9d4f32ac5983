//! `container_mig_device_allocation_info` through a real gRPC pod-resources server on a unix socket (a fake
//! kubelet, tonic): a mock GPU in MIG mode with two instances, one held by a container through the MIG
//! plugin's resource; the monitor's [`KubeletPodResources`] cache picks the answer up and the page shows one
//! series for the held instance (none for the free one, none for a UUID listed under another resource), next
//! to `mig_device_total_memory_in_bytes` for both. A kubelet that stops answering leaves the last answer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use vgpu_core::backend::mock::MockBackend;
use vgpu_kubelet::api::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices, ContainerResources,
    GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
    pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
};
use vgpu_monitor::{
    collect::{MonitorConfig, NodeCollector},
    metrics,
    podres::KubeletPodResources,
    pods::InMemoryPods,
    server::{MonitorServer, ServerConfig},
};

const MOCK: &str = "\
gpus:
  - uuid: GPU-mig
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    mig:
      mode: Enabled
      instances:
        - { uuid: MIG-a, profile: 3g.40gb, gpuInstanceId: 1, computeInstanceId: 0, placementStart: 0, placementSize: 4, memoryMiB: 40320 }
        - { uuid: MIG-b, profile: 1g.10gb, gpuInstanceId: 7, computeInstanceId: 0, placementStart: 4, placementSize: 1, memoryMiB: 9856 }
";

/// A kubelet answering `List` with `pods`, or `Unavailable` when `down`.
#[derive(Default)]
struct Kubelet {
    pods: Mutex<Vec<PodResources>>,
    down: Mutex<bool>,
    /// Calls refused while down.
    refused: std::sync::atomic::AtomicUsize,
}

struct Server(Arc<Kubelet>);

#[tonic::async_trait]
impl PodResourcesLister for Server {
    async fn list(
        &self,
        _request: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        if *self.0.down.lock().unwrap() {
            self.0.refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(Status::unavailable("kubelet is restarting"));
        }
        Ok(Response::new(ListPodResourcesResponse { pod_resources: self.0.pods.lock().unwrap().clone() }))
    }
    async fn get_allocatable_resources(
        &self,
        _request: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
    async fn get(
        &self,
        _request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("not used"))
    }
}

fn pod(name: &str, container: &str, resource: &str, ids: &[&str]) -> PodResources {
    PodResources {
        namespace: "ns".into(),
        name: name.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                topology: None,
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Renders until `done` holds for the page (each render is a real scrape; the cache refreshes every 50 ms).
async fn page_where(server: &Arc<MonitorServer>, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let server = Arc::clone(server);
        let page = tokio::task::spawn_blocking(move || server.render(false).unwrap()).await.unwrap();
        if done(&page) {
            return page;
        }
        assert!(tokio::time::Instant::now() < deadline, "never reached:\n{page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_allocations_come_from_the_kubelet() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet = Arc::new(Kubelet::default());
    *kubelet.pods.lock().unwrap() = vec![
        pod("train", "main", "nvidia.com/mig-3g.40gb", &["MIG-a"]),
        // MIG-b's UUID under the wrong resource: not an allocation of that instance.
        pod("odd", "main", "nvidia.com/vgpu-number", &["MIG-b"]),
    ];
    let listener = UnixListener::bind(&socket).unwrap();
    let service = PodResourcesListerServer::new(Server(Arc::clone(&kubelet)));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await
            .unwrap();
    });

    let backend = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let pods = Arc::new(InMemoryPods::default());
    let source = KubeletPodResources::start(socket, Duration::from_millis(50), Duration::from_secs(5));
    let collector = NodeCollector::new(MonitorConfig::new("node-1"), backend, pods.clone())
        .with_pod_resources(Arc::new(source));
    let mut registry = metrics::new_registry();
    metrics::register(&mut registry, Arc::new(collector));
    let server = MonitorServer::new(registry, pods, ServerConfig::default());

    let held = r#"container_mig_device_allocation_info{service="vGPU",node="node-1",device_idx="0",device_uuid="MIG-a",parent_uuid="GPU-mig",pod_namespace="ns",pod_name="train",container_name="main"} 1"#;
    let page = page_where(&server, |p| p.contains(held)).await;
    assert_eq!(
        page.lines().filter(|l| l.starts_with("container_mig_device_allocation_info{")).count(),
        1,
        "{page}"
    );
    assert_eq!(
        support::value(
            &page,
            "mig_device_total_memory_in_bytes",
            &[("device_uuid", "MIG-b"), ("profile", "1g.10gb")]
        ),
        9856.0 * 1024.0 * 1024.0
    );

    // The kubelet goes down: the last answer stays. It comes back with MIG-b handed out too.
    *kubelet.down.lock().unwrap() = true;
    *kubelet.pods.lock().unwrap() = vec![
        pod("train", "main", "nvidia.com/mig-3g.40gb", &["MIG-a"]),
        pod("infer", "server", "nvidia.com/mig-1g.10gb", &["MIG-b"]),
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while kubelet.refused.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        assert!(tokio::time::Instant::now() < deadline, "the cache never asked the kubelet again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let page = server.render(false).unwrap();
    assert!(page.contains(held), "{page}");
    assert!(!page.contains(r#"pod_name="infer""#), "{page}");
    *kubelet.down.lock().unwrap() = false;
    let page = page_where(&server, |p| p.contains(r#"device_uuid="MIG-b",parent_uuid="GPU-mig",pod_namespace="ns",pod_name="infer",container_name="server"} 1"#)).await;
    assert_eq!(
        page.lines().filter(|l| l.starts_with("container_mig_device_allocation_info{")).count(),
        2,
        "{page}"
    );
}
