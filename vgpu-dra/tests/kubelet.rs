//! The test plays the kubelet against the real plugin servers over unix sockets: it dials the registration
//! socket (`GetInfo`, `NotifyRegistrationStatus`), then calls `NodePrepareResources` /
//! `NodeUnprepareResources` (v1 and v1beta1) and `NodeWatchResources` (v1 and v1alpha1) on the endpoint it
//! was given, with in-memory claims and the mock backend. The plugin is restarted between Prepare and
//! Unprepare to prove recovery from the checkpoint, and its registration socket is deleted to prove it is
//! re-created.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{path::Path, time::Duration};

use support::{NODE, TestNode};
use tonic::transport::Channel;
use vgpu_core::backend::{HealthEvent, HealthEventKind};
use vgpu_kubelet::api::{dra_v1, dra_v1beta1, health_v1, health_v1alpha1, pluginregistration as pr};
use vgpu_kubelet::socket::connect_unix;

async fn channel(path: &Path) -> Channel {
    connect_unix(path, Duration::from_secs(5)).await.unwrap()
}

fn claim(name: &str, uid: &str) -> dra_v1::Claim {
    dra_v1::Claim { namespace: "ns".into(), uid: uid.into(), name: name.into() }
}

/// What the kubelet's plugin watcher does: `GetInfo`, then report success.
async fn register(socket: &Path) -> pr::PluginInfo {
    let mut client = pr::registration_client::RegistrationClient::new(channel(socket).await);
    let info = client.get_info(pr::InfoRequest {}).await.unwrap().into_inner();
    client
        .notify_registration_status(pr::RegistrationStatus { plugin_registered: true, error: String::new() })
        .await
        .unwrap();
    info
}

#[tokio::test]
async fn kubelet_registers_prepares_restarts_and_unprepares() {
    let node = TestNode::new();
    node.add_vgpu_claim("c1", "uid-1", "vgpu-0", "s1", "10", "1Gi");
    let running = node.serve().await;
    let mut registration = running.registration.clone();

    let info = register(&running.registration_socket).await;
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "manager.nvidia.com");
    assert_eq!(Path::new(&info.endpoint), node.config.dra_socket());
    assert_eq!(info.supported_versions, ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth"]);
    registration.wait_for(|s| s.notifications == 1 && s.registered).await.unwrap();

    // Prepare through v1: one good claim, one the API does not know.
    let mut dra = dra_v1::dra_plugin_client::DraPluginClient::new(channel(Path::new(&info.endpoint)).await);
    let response = dra
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![claim("c1", "uid-1"), claim("gone", "uid-x")],
        })
        .await
        .unwrap()
        .into_inner();
    let ok = &response.claims["uid-1"];
    assert_eq!(ok.error, "");
    assert_eq!(ok.devices.len(), 1);
    let device = &ok.devices[0];
    assert_eq!((device.pool_name.as_str(), device.device_name.as_str()), (NODE, "vgpu-0"));
    assert_eq!(device.request_names, ["gpu"]);
    assert_eq!(device.share_id.as_deref(), Some("s1"));
    assert_eq!(device.cdi_device_ids, ["k8s.manager.nvidia.com/claim=uid-1-gpu-vgpu-0-share-s1"]);
    assert_eq!(response.claims["uid-x"].error, "ResourceClaim ns/gone not found");
    assert!(response.claims["uid-x"].devices.is_empty());

    // The CDI spec carries the share's limits; the partition directories exist.
    assert_eq!(node.cdi_files(), ["k8s.manager.nvidia.com-claim_uid-1.json"]);
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.config.cdi_spec_path("uid-1")).unwrap()).unwrap();
    assert_eq!(spec["kind"], "k8s.manager.nvidia.com/claim");
    assert_eq!(spec["devices"][0]["name"], "uid-1-gpu-vgpu-0-share-s1");
    let env: Vec<&str> = spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for want in [
        "CUDA_MEM_LIMIT_0=1024m",
        "CUDA_CORE_LIMIT_0=10",
        "MANAGER_VISIBLE_DEVICE_0=GPU-a",
        "CUDA_MEM_RATIO_0=1.00",
    ] {
        assert!(env.contains(&want), "{want} missing from {env:?}");
    }
    let common: Vec<&str> =
        spec["containerEdits"]["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(common.contains(&"LD_PRELOAD=/etc/vgpu-manager/driver/libvgpu-control.so"), "{common:?}");
    assert!(common.contains(&"MANAGER_VGPU_CLAIM_UID=uid-1"), "{common:?}");
    assert_eq!(spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidia0");
    let part = node.config.claim_dir("uid-1").join("gpu");
    for sub in ["config", "vgpu_lock", "vmem_node", "sm_node", "config/pids.config"] {
        assert!(part.join(sub).exists(), "{sub}");
    }
    assert_eq!(
        spec["devices"][0]["containerEdits"]["mounts"][0]["hostPath"],
        node.config.host_claim_dir("uid-1").join("gpu/config").display().to_string()
    );

    // Health, both versions: the current list, then every change.
    let mut h1 = health_v1::dra_resource_health_client::DraResourceHealthClient::new(
        channel(Path::new(&info.endpoint)).await,
    );
    let mut stream =
        h1.node_watch_resources(health_v1::NodeWatchResourcesRequest {}).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 2);
    assert_eq!(first.devices[0].device.as_ref().unwrap().pool_name, NODE);
    assert_eq!(first.devices[0].health(), health_v1::HealthStatus::Healthy);
    assert!(node.health.apply(&HealthEvent {
        index: 1,
        uuid: "GPU-b".into(),
        kind: HealthEventKind::Xid { code: 79 },
        message: "fell off the bus".into(),
    }));
    let second = stream.message().await.unwrap().unwrap();
    assert_eq!(second.devices[0].health(), health_v1::HealthStatus::Healthy);
    assert_eq!(second.devices[1].device.as_ref().unwrap().device_name, "vgpu-1");
    assert_eq!(second.devices[1].health(), health_v1::HealthStatus::Unhealthy);
    assert!(second.devices[1].message.contains("79"), "{:?}", second.devices[1].message);
    let mut h0 = health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
        channel(Path::new(&info.endpoint)).await,
    );
    let mut alpha =
        h0.node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {}).await.unwrap().into_inner();
    let now = alpha.message().await.unwrap().unwrap();
    assert_eq!(now.devices[1].device.as_ref().unwrap().device_name, "vgpu-1");
    assert_eq!(now.devices[1].health(), health_v1alpha1::HealthStatus::Unhealthy);
    assert_eq!(now.devices[0].health(), health_v1alpha1::HealthStatus::Healthy);

    // Restart the plugin: the checkpoint answers Prepare (no new side effects) and Unprepare.
    running.stop().await.unwrap();
    assert!(stream.message().await.map(|m| m.is_none()).unwrap_or(true), "health stream ends on stop");
    assert!(!node.config.dra_socket().exists() && !node.config.registration_socket().exists());
    let before = std::fs::metadata(node.config.cdi_spec_path("uid-1")).unwrap().modified().unwrap();
    node.claims.fail_next("the API is not asked for a prepared claim");
    let running = node.serve().await;
    let info = register(&running.registration_socket).await;
    let endpoint = Path::new(&info.endpoint);
    let mut dra = dra_v1::dra_plugin_client::DraPluginClient::new(channel(endpoint).await);
    let again = dra
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: vec![claim("c1", "uid-1")] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims["uid-1"], *ok, "the recorded devices");
    assert_eq!(std::fs::metadata(node.config.cdi_spec_path("uid-1")).unwrap().modified().unwrap(), before);
    {
        use vgpu_dra::claims::ClaimSource;
        assert!(
            node.claims.get("ns", "c1").await.is_err(),
            "the injected failure was not consumed: no API call"
        );
    }

    // Unprepare through v1beta1; twice (NotFound = done), and a claim never prepared.
    let mut beta = dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel(endpoint).await);
    for _ in 0..2 {
        let done = beta
            .node_unprepare_resources(dra_v1beta1::NodeUnprepareResourcesRequest {
                claims: vec![
                    dra_v1beta1::Claim { namespace: "ns".into(), uid: "uid-1".into(), name: "c1".into() },
                    dra_v1beta1::Claim { namespace: "ns".into(), uid: "uid-never".into(), name: "n".into() },
                ],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(done.claims.len(), 2);
        assert!(done.claims.values().all(|r| r.error.is_empty()), "{done:?}");
    }
    assert!(node.cdi_files().is_empty(), "{:?}", node.cdi_files());
    assert!(node.claim_dirs().is_empty(), "{:?}", node.claim_dirs());
    let state = node.state().await;
    assert!(state.checkpoint().await.unwrap().claims().is_empty());

    // v1beta1 Prepare answers the same devices (without share IDs on the wire).
    node.add_vgpu_claim("c2", "uid-2", "vgpu-1", "s2", "50", "2Gi");
    let prepared = beta
        .node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![dra_v1beta1::Claim {
                namespace: "ns".into(),
                uid: "uid-2".into(),
                name: "c2".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        prepared.claims["uid-2"].devices[0].cdi_device_ids,
        ["k8s.manager.nvidia.com/claim=uid-2-gpu-vgpu-1-share-s2"]
    );
    running.stop().await.unwrap();
}

#[tokio::test]
async fn the_registration_socket_is_re_created_when_deleted() {
    let node = TestNode::new();
    let running = node.serve().await;
    register(&running.registration_socket).await;
    std::fs::remove_file(&running.registration_socket).unwrap();
    // The guard checks every 20 ms; wait for the condition, bounded.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !vgpu_dra::driver::socket_exists(&running.registration_socket) {
        assert!(tokio::time::Instant::now() < deadline, "registration socket not re-created");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let info = register(&running.registration_socket).await;
    assert_eq!(info.name, "manager.nvidia.com");
    let mut registration = running.registration.clone();
    registration.wait_for(|s| s.notifications == 2).await.unwrap();
    // A replaced DRA socket is bound again too.
    std::fs::remove_file(&running.dra_socket).unwrap();
    std::fs::write(&running.dra_socket, b"not a socket").unwrap();
    while !vgpu_dra::driver::socket_exists(&running.dra_socket) {
        assert!(tokio::time::Instant::now() < deadline, "DRA socket not re-created");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut dra = dra_v1::dra_plugin_client::DraPluginClient::new(channel(&running.dra_socket).await);
    let r = dra
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims: vec![claim("c", "u")] })
        .await;
    assert!(r.unwrap().into_inner().claims["u"].error.is_empty());
    running.stop().await.unwrap();
}

#[tokio::test]
async fn the_grpc_health_check_follows_both_sockets() {
    use vgpu_dra::{
        api::grpc_health::{
            HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
        },
        healthcheck::{HealthCheck, serve},
    };
    let node = TestNode::new();
    let running = node.serve().await;
    let check = HealthCheck::new(running.registration_socket.clone(), running.dra_socket.clone());
    let stop = tokio_util::sync::CancellationToken::new();
    let (addr, task) =
        serve(check, "127.0.0.1:0".parse().unwrap(), stop.clone().cancelled_owned()).await.unwrap();
    let mut client = HealthClient::connect(format!("http://{addr}")).await.unwrap();
    let status =
        |r: tonic::Response<vgpu_dra::api::grpc_health::HealthCheckResponse>| r.into_inner().status();
    let ask = || HealthCheckRequest { service: String::new() };
    assert_eq!(status(client.check(ask()).await.unwrap()), ServingStatus::Serving);
    running.stop().await.unwrap();
    assert_eq!(status(client.check(ask()).await.unwrap()), ServingStatus::NotServing);
    stop.cancel();
    task.await.unwrap();
}
