//! The DRA driver's node side against the real control plane (issue #17): the `vgpu-kubelet-plugin` binary
//! on the mock backend publishes its ResourceSlice (owned by the Node), the real kube-scheduler allocates a
//! claim of `capacity.requests {cores: 10, memory: 1Gi}` of class `vgpu-manager` from it and binds the pod,
//! then the test plays the kubelet over the plugin's real sockets: `GetInfo` and `NotifyRegistrationStatus`
//! on the registration socket, `NodePrepareResources` on the endpoint it names (the plugin reads the claim
//! from kube-apiserver), the CDI spec carrying `CUDA_MEM_LIMIT_0=1024m` and `CUDA_CORE_LIMIT_0=10` for that
//! share and the partition directory of the pod's container (`claims/<uid>/pod-<hash>-app/cuda`: the plugin
//! reads the consumer pod), then `NodeUnprepareResources` removing the spec and the claim directory.
//!
//! With gate `DevicePluginClientMode` the same run also checks the claim's `manager.nvidia.com/<uuid>`
//! annotation (patched through kube-apiserver, removed by Unprepare), the device's
//! `MANAGER_CLIENT_REGISTER_UUID` and the served registry socket.
//!
//! Needs the control-plane binaries and `vgpu-kubelet-plugin` built: run `e2e/run.sh dra_prepare`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{path::Path, time::Duration};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::json;
use vgpu_e2e::{TestEnv, fixtures, scheduler_configuration, vgpu_binary};
use vgpu_kubelet::api::{dra_v1, pluginregistration as pr};
use vgpu_kubelet::socket::connect_unix;

const NODE: &str = "dra-prepare-node";
const NAMESPACE: &str = "default";
const TIMEOUT: Duration = Duration::from_secs(60);
const MOCK: &str =
    "gpus:\n  - { uuid: GPU-DRA-0, name: NVIDIA A30, memoryMiB: 24576, computeCapability: '8.0' }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn the_plugin_prepares_a_claim_the_scheduler_allocated() {
    prepare_through_the_binary("the_plugin_prepares_a_claim_the_scheduler_allocated", false).await;
}

/// Gate `DevicePluginClientMode`: the plugin patches the claim with `manager.nvidia.com/<uuid>: <partition>`
/// through kube-apiserver, the device's CDI env carries that UUID, the registry socket is served, and
/// Unprepare removes the annotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn client_mode_annotates_the_claim_with_its_register_uuid() {
    prepare_through_the_binary("client_mode_annotates_the_claim_with_its_register_uuid", true).await;
}

async fn prepare_through_the_binary(name: &str, client_mode: bool) {
    let mut env = TestEnv::builder(name).start().await.unwrap();
    let client = env.client().await.unwrap();
    env.start_scheduler_with_config(&scheduler_configuration(env.kubeconfig_path(), &[])).await.unwrap();

    // The node (the kubelet's part) and the DeviceClasses of the manifest.
    let (node, _) = fixtures::create_dra_node_and_classes(&client, NODE).await.unwrap();

    // The plugin, as a process.
    let dir = env.workdir().join("node");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("mock.yaml"), MOCK).unwrap();
    let path = |rel: &str| dir.join(rel).display().to_string();
    // The vGPU runtime files an install step puts on the host.
    vgpu_core::abi::runtime_files::install(&dir.join("manager"), "v1.0.0", b"").unwrap();
    let args = vec![
        "--backend=mock".to_owned(),
        format!("--mock-config={}", path("mock.yaml")),
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--kubelet-registrar-directory-path={}", path("plugins_registry")),
        format!("--kubelet-plugins-directory-path={}", path("plugins")),
        format!("--cdi-root={}", path("cdi")),
        format!("--host-manager-dir={}", path("manager")),
        "--healthcheck-port=0".to_owned(),
    ];
    let gates = if client_mode { "DevicePluginClientMode=true" } else { "" };
    let env_vars =
        vec![("NODE_NAME".to_owned(), NODE.to_owned()), ("FEATURE_GATES".to_owned(), gates.to_owned())];
    env.start_process("kubelet-plugin", &vgpu_binary("vgpu-kubelet-plugin").unwrap(), &args, &env_vars)
        .unwrap();

    // Its slice, owned by the Node.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let slice = env
        .poll("the plugin's ResourceSlice", TIMEOUT, || async {
            let list =
                slices.list(&ListParams::default().fields(&format!("spec.nodeName={NODE}"))).await.ok()?;
            list.items.into_iter().next()
        })
        .await
        .unwrap();
    let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));
    assert_eq!(Some(&owner.uid), node.metadata.uid.as_ref());

    // The kubelet registers the plugin.
    let registration = dir.join("plugins_registry/manager.nvidia.com-reg.sock");
    let info = env
        .poll("the registration socket", TIMEOUT, || async {
            let channel = connect_unix(&registration, Duration::from_secs(2)).await.ok()?;
            let mut client = pr::registration_client::RegistrationClient::new(channel);
            let info = client.get_info(pr::InfoRequest {}).await.ok()?.into_inner();
            client
                .notify_registration_status(pr::RegistrationStatus {
                    plugin_registered: true,
                    error: String::new(),
                })
                .await
                .ok()?;
            Some(info)
        })
        .await
        .unwrap();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "manager.nvidia.com");

    // A claim of one vGPU share and its pod: allocated and bound by the real scheduler.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let capacity = json!({ "requests": { "cores": "10", "memory": "1Gi" } });
    let claim = fixtures::dra_claim(NAMESPACE, "share", "vgpu-manager", &capacity).unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let pod = fixtures::dra_pod(NAMESPACE, "cuda", "share").unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(fixtures::wait_for_pod_node(&client, NAMESPACE, "cuda", TIMEOUT).await.unwrap(), NODE);
    let allocated = claims.get("share").await.unwrap();
    let uid = allocated.metadata.uid.clone().unwrap();

    // The kubelet prepares it.
    let endpoint = Path::new(&info.endpoint);
    let channel = connect_unix(endpoint, Duration::from_secs(5)).await.unwrap();
    let mut dra = dra_v1::dra_plugin_client::DraPluginClient::new(channel);
    let wire = dra_v1::Claim { namespace: NAMESPACE.into(), uid: uid.clone(), name: "share".into() };
    let response = dra
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: vec![wire.clone()] })
        .await
        .unwrap()
        .into_inner();
    let prepared = &response.claims[&uid];
    assert_eq!(prepared.error, "", "{}", env.log_tail("kubelet-plugin", 30));
    assert_eq!(prepared.devices.len(), 1);
    let device = &prepared.devices[0];
    assert_eq!((device.pool_name.as_str(), device.device_name.as_str()), (NODE, "vgpu-0"));
    assert_eq!(device.request_names, ["vgpu"]);
    let result = &allocated.status.unwrap().allocation.unwrap().devices.unwrap().results.unwrap()[0];
    assert_eq!(device.share_id, result.share_id, "the allocation's share");
    let spec_path = dir.join("cdi").join(format!("k8s.manager.nvidia.com-claim_{uid}.json"));
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    println!("CDI spec of claim share ({uid}): {spec:#}");
    let env_of_device: Vec<&str> = spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(env_of_device.contains(&"CUDA_MEM_LIMIT_0=1024m"), "{env_of_device:?}");
    assert!(env_of_device.contains(&"CUDA_CORE_LIMIT_0=10"), "{env_of_device:?}");
    assert!(env_of_device.contains(&"MANAGER_VISIBLE_DEVICE_0=GPU-DRA-0"), "{env_of_device:?}");
    assert_eq!(
        format!("k8s.manager.nvidia.com/claim={}", spec["devices"][0]["name"].as_str().unwrap()),
        device.cdi_device_ids[0]
    );
    // The partition of the pod's one container (the plugin read the pod: contract §9's partition walk).
    let pod_uid = pods.get("cuda").await.unwrap().metadata.uid.unwrap();
    let key = vgpu_dra::partition::single_key(&vgpu_dra::partition::ContainerRef {
        pod_uid,
        kind: vgpu_dra::partition::Kind::App,
        name: "cuda".into(),
    });
    assert!(key.ends_with("-app/cuda"), "{key}");
    assert!(dir.join("manager/claims").join(&uid).join(&key).join("config/pids.config").exists(), "{key}");
    let mounts = spec["devices"][0]["containerEdits"]["mounts"].to_string();
    assert!(mounts.contains(&format!("claims/{uid}/{key}/config")), "{mounts}");
    let annotation_prefix = "manager.nvidia.com/";
    let register_annotations = || {
        let claims = claims.clone();
        async move {
            let annotations = claims.get("share").await.unwrap().metadata.annotations.unwrap_or_default();
            annotations
                .into_iter()
                .filter(|(k, _)| k.strip_prefix(annotation_prefix).is_some_and(|u| u.len() == 36))
                .collect::<Vec<_>>()
        }
    };
    let registered = register_annotations().await;
    if client_mode {
        // One partition, one UUID: in the claim (patched through the API) and in the device's env.
        assert_eq!(registered.len(), 1, "{registered:?}");
        let (annotation, partition) = &registered[0];
        assert_eq!(partition, &key);
        let uuid = &annotation[annotation_prefix.len()..];
        assert!(
            env_of_device.contains(&format!("MANAGER_CLIENT_REGISTER_UUID={uuid}").as_str()),
            "{env_of_device:?}"
        );
        assert!(
            vgpu_dra::driver::socket_exists(&dir.join("manager/registry/socket.sock")),
            "registry served"
        );
    } else {
        assert!(registered.is_empty(), "{registered:?}");
        assert!(
            !env_of_device.iter().any(|e| e.starts_with("MANAGER_CLIENT_REGISTER_UUID")),
            "{env_of_device:?}"
        );
    }

    // And unprepares it.
    let done = dra
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims: vec![wire] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.claims[&uid].error, "");
    assert!(!spec_path.exists());
    assert!(!dir.join("manager/claims").join(&uid).exists());
    assert!(register_annotations().await.is_empty(), "Unprepare removes the register-UUID annotation");
    env.check_process("kubelet-plugin").unwrap();
    env.stop_process("kubelet-plugin").unwrap();
    env.finish();
}
