//! Gate `DynamicMIG` against the real control plane (issue #18): the `vgpu-kubelet-plugin` binary on the
//! mock backend (one A100 80GB in MIG mode, its MIG layout in a state file) publishes the GPU's MIG devices
//! (`gpu-0-mig-<profileId>-<start>-<size>`, class `mig-manager`) and its counter set in a slice of its own;
//! kube-apiserver accepts both and the real kube-scheduler allocates from the partitionable devices:
//!
//! 1. claim `big` asks for profile `4g.40gb` (memory slices 0..4) → allocated `gpu-0-mig-5-0-4`;
//! 2. claim `whole` asks for `7g.80gb` (slices 0..8), which overlaps it → never allocated, its pod stays
//!    `Unschedulable` (the slices' counters are spent);
//! 3. claim `half` asks for `3g.40gb` (starts 0 or 4) → the scheduler must pick `gpu-0-mig-9-4-4`, the one
//!    placement that does not overlap `big`.
//!
//! Then the test plays the kubelet over the plugin's sockets: `NodePrepareResources` of `big` and `half`
//! creates both instances (the mock's state file shows `4g.40gb` at 0 and `3g.40gb` at 4, and each CDI spec
//! names its MIG UUID), `NodeUnprepareResources` of `big` destroys its instance and leaves `half`'s.
//!
//! `DRAPartitionableDevices` is Beta and on by default in Kubernetes 1.36+ (kube-apiserver and
//! kube-scheduler v1.37.2), so the environment's feature gates are left as they are.
//!
//! Needs the control-plane binaries and `vgpu-kubelet-plugin` built: run `e2e/run.sh dra_mig`.
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
use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
use vgpu_e2e::{TestEnv, fixtures, scheduler_configuration, vgpu_binary};
use vgpu_kubelet::api::{dra_v1, pluginregistration as pr};
use vgpu_kubelet::socket::connect_unix;

const NODE: &str = "dra-mig-node";
const NAMESPACE: &str = "default";
const TIMEOUT: Duration = Duration::from_secs(60);

fn mock(state_file: &Path) -> String {
    format!(
        "gpus:\n  - {{ uuid: GPU-MIG-0, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, computeCapability: '8.0', mig: {{ mode: Enabled }} }}\nmigStateFile: {}\n",
        state_file.display()
    )
}

/// A claim of one MIG device of `profile`.
fn mig_claim(name: &str, profile: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": { "devices": { "requests": [{
            "name": "mig",
            "exactly": {
                "deviceClassName": "mig-manager",
                "allocationMode": "ExactCount",
                "count": 1,
                "selectors": [{ "cel": {
                    "expression": format!("device.attributes['manager.nvidia.com'].profile == '{profile}'"),
                } }],
            },
        }] } },
    }))
    .unwrap()
}

fn pod(name: &str, claim: &str) -> Pod {
    fixtures::dra_pod(NAMESPACE, name, claim).unwrap()
}

fn allocated_device(claim: &ResourceClaim) -> Option<String> {
    let results = claim.status.as_ref()?.allocation.as_ref()?.devices.as_ref()?.results.clone()?;
    results.first().map(|r| r.device.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn dra_mig_partitions_are_allocated_without_overlap_and_created_on_prepare() {
    let mut env = TestEnv::builder("dra_mig_partitions_are_allocated_without_overlap_and_created_on_prepare")
        .start()
        .await
        .unwrap();
    let client = env.client().await.unwrap();
    env.start_scheduler_with_config(&scheduler_configuration(env.kubeconfig_path(), &[])).await.unwrap();
    fixtures::create_dra_node_and_classes(&client, NODE).await.unwrap();

    let dir = env.workdir().join("node");
    std::fs::create_dir_all(&dir).unwrap();
    let state_file = dir.join("mig-state.json");
    std::fs::write(dir.join("mock.yaml"), mock(&state_file)).unwrap();
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
    let env_vars = vec![
        ("NODE_NAME".to_owned(), NODE.to_owned()),
        ("FEATURE_GATES".to_owned(), "DynamicMIG=true,NVMLDeviceHealthCheck=false".to_owned()),
    ];
    env.start_process("kubelet-plugin", &vgpu_binary("vgpu-kubelet-plugin").unwrap(), &args, &env_vars)
        .unwrap();

    // Its pool: a device slice with the 25 MIG placements and a counter slice, both accepted.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let pool = env
        .poll("the plugin's two ResourceSlices", TIMEOUT, || async {
            let list =
                slices.list(&ListParams::default().fields(&format!("spec.nodeName={NODE}"))).await.ok()?;
            (list.items.len() == 2).then_some(list.items)
        })
        .await
        .unwrap();
    let devices: Vec<_> = pool.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
    assert_eq!(devices.len(), 25, "{:?}", devices.iter().map(|d| &d.name).collect::<Vec<_>>());
    let sets: Vec<_> = pool.iter().flat_map(|s| s.spec.shared_counters.iter().flatten()).collect();
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].name, "gpu-0-counter-set");
    assert!(
        devices
            .iter()
            .all(|d| d.consumes_counters.as_ref().is_some_and(|c| c[0].counter_set == sets[0].name)),
        "the API server kept consumesCounters (DRAPartitionableDevices on)"
    );

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

    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    // 1. big: 4g.40gb at slices 0..4.
    claims.create(&PostParams::default(), &mig_claim("big", "4g.40gb")).await.unwrap();
    pods.create(&PostParams::default(), &pod("big", "big")).await.unwrap();
    assert_eq!(fixtures::wait_for_pod_node(&client, NAMESPACE, "big", TIMEOUT).await.unwrap(), NODE);
    let big = claims.get("big").await.unwrap();
    assert_eq!(allocated_device(&big).as_deref(), Some("gpu-0-mig-5-0-4"));

    // 2. whole: 7g.80gb overlaps big: never allocated.
    claims.create(&PostParams::default(), &mig_claim("whole", "7g.80gb")).await.unwrap();
    pods.create(&PostParams::default(), &pod("whole", "whole")).await.unwrap();
    let message = env
        .poll("pod whole unschedulable", TIMEOUT, || async {
            let pod = pods.get("whole").await.ok()?;
            let condition = pod.status?.conditions?.into_iter().find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })?;
            Some(condition.message.unwrap_or_default())
        })
        .await
        .unwrap();
    println!("pod whole PodScheduled=False Unschedulable: {message}");
    assert!(message.contains("0/1 nodes are available"), "{message}");

    // 3. half: 3g.40gb could start at 0 or 4; only 4 is free.
    claims.create(&PostParams::default(), &mig_claim("half", "3g.40gb")).await.unwrap();
    pods.create(&PostParams::default(), &pod("half", "half")).await.unwrap();
    assert_eq!(fixtures::wait_for_pod_node(&client, NAMESPACE, "half", TIMEOUT).await.unwrap(), NODE);
    let half = claims.get("half").await.unwrap();
    assert_eq!(allocated_device(&half).as_deref(), Some("gpu-0-mig-9-4-4"));
    assert_eq!(allocated_device(&claims.get("whole").await.unwrap()), None, "still never allocated");
    assert_eq!(pods.get("whole").await.unwrap().spec.unwrap().node_name, None);

    // The kubelet prepares big and half: the instances are created at their placements.
    let channel = connect_unix(Path::new(&info.endpoint), Duration::from_secs(5)).await.unwrap();
    let mut dra = dra_v1::dra_plugin_client::DraPluginClient::new(channel);
    let wire = |c: &ResourceClaim| dra_v1::Claim {
        namespace: NAMESPACE.into(),
        uid: c.metadata.uid.clone().unwrap(),
        name: c.metadata.name.clone().unwrap(),
    };
    let response = dra
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: vec![wire(&big), wire(&half)] })
        .await
        .unwrap()
        .into_inner();
    for c in [&big, &half] {
        let uid = c.metadata.uid.as_ref().unwrap();
        assert_eq!(response.claims[uid].error, "", "{}", env.log_tail("kubelet-plugin", 30));
    }
    let instances = || {
        let backend = MockBackend::from_yaml_str(&mock(&state_file)).unwrap();
        let mut v: Vec<(String, u32, String)> = backend
            .mig_layout(0)
            .unwrap()
            .instances
            .into_iter()
            .map(|i| (i.profile.to_string(), i.placement_start, i.uuid))
            .collect();
        v.sort();
        v
    };
    let created = instances();
    println!("MIG instances after Prepare: {created:?}");
    let shape: Vec<_> = created.iter().map(|(p, s, _)| (p.as_str(), *s)).collect();
    assert_eq!(shape, [("3g.40gb", 4), ("4g.40gb", 0)]);
    let big_uid = big.metadata.uid.clone().unwrap();
    let spec =
        std::fs::read_to_string(dir.join("cdi").join(format!("k8s.manager.nvidia.com-claim_{big_uid}.json")))
            .unwrap();
    let big_mig = &created.iter().find(|(p, ..)| p == "4g.40gb").unwrap().2;
    assert!(spec.contains(&format!("NVIDIA_VISIBLE_DEVICES={big_mig}")), "{spec}");

    // Unprepare big: its instance is destroyed, half's stays.
    let done = dra
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims: vec![wire(&big)] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(done.claims[&big_uid].error, "");
    let left: Vec<_> = instances().into_iter().map(|(p, s, _)| (p, s)).collect();
    assert_eq!(left, [("3g.40gb".to_owned(), 4)]);
    env.check_process("kubelet-plugin").unwrap();
    env.stop_process("kubelet-plugin").unwrap();
    env.finish();
}
