//! Gate `DevicePluginClientMode` and the partition walk on the DRA path, at the state + registry layer:
//! [`DeviceState`] over real files with in-memory claims and pods, and the device plugin's registry server
//! (`vgpu_deviceplugin::registry`, the same code the device plugin serves) on a real unix socket with the
//! plugin's [`RegisterTable`](vgpu_dra::client_mode::RegisterTable) as its register-UUID resolver. The caller
//! is this test process: its `SO_PEERCRED` PID is put into the consumer pod's cgroup under a fake `/proc`,
//! and that cgroup's `cgroup.procs` lists it.
//!
//! Gate on: each vGPU partition gets a register UUID (checkpoint, claim annotation `manager.nvidia.com/<uuid>`,
//! per-device CDI env `MANAGER_CLIENT_REGISTER_UUID`, the registry mount instead of `.host_proc`);
//! registering that UUID over gRPC writes the partition's `pids.config`; an unknown UUID, a malformed one and
//! a caller of another pod are refused with their reasons; Unprepare removes the annotation and the UUID.
//! Gate off: no such env, annotation or UUID. Partitions: containers sharing a request get one `cg-…`
//! directory, a lone container its `pod-…-app/<name>` directory, an unused request its own name.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{collections::BTreeMap, path::Path, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Container, Pod, PodResourceClaim, PodSpec, ResourceRequirements};
use support::{DRIVER, NODE, TestNode};
use tonic::Code;
use vgpu_core::node_config::CgroupDriver;
use vgpu_deviceplugin::{
    api::registry::{ContainerDeviceRequest, v_device_registry_client::VDeviceRegistryClient},
    registry::{RegistryConfig, serve_registry_with},
};
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    claims::{ClaimSource, allocated, allocation_result, claim},
    client_mode::RegisterResolver,
    partition::{ContainerRef, Kind, group_key, single_key},
};
use vgpu_gates::DraGate;
use vgpu_kubelet::socket::connect_unix;

const POD: &str = "0b1a22cd-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
const OTHER_POD: &str = "7e7e7e7e-1111-4222-8333-944444444444";

fn cgroup_of(pod: &str) -> String {
    format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-c0ffee.scope",
        pod.replace('-', "_")
    )
}

/// A pod `name` (UID `uid`) whose `spec.resourceClaims` entry `gpu` is claim `claim_name`, with app
/// containers `(name, request)` using it (`None`: every request).
fn pod(name: &str, uid: &str, claim_name: &str, containers: &[(&str, Option<&str>)]) -> Pod {
    let mut p = Pod::default();
    p.metadata.namespace = Some("ns".into());
    p.metadata.name = Some(name.into());
    p.metadata.uid = Some(uid.into());
    p.spec = Some(PodSpec {
        containers: containers
            .iter()
            .map(|(c, r)| Container {
                name: (*c).into(),
                resources: Some(ResourceRequirements {
                    claims: Some(vec![k8s_openapi::api::core::v1::ResourceClaim {
                        name: "gpu".into(),
                        request: r.map(str::to_owned),
                    }]),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            })
            .collect(),
        resource_claims: Some(vec![PodResourceClaim {
            name: "gpu".into(),
            resource_claim_name: Some(claim_name.into()),
            ..PodResourceClaim::default()
        }]),
        ..PodSpec::default()
    });
    p
}

/// Claim `ns/<name>` with one share per `(request, device, share)`, reserved for pod `pod_name` (`pod_uid`).
fn add_claim(
    node: &TestNode,
    name: &str,
    uid: &str,
    results: &[(&str, &str, &str)],
    pod_name: &str,
    pod_uid: &str,
) {
    let results = results
        .iter()
        .map(|(req, dev, share)| {
            allocation_result(req, DRIVER, NODE, dev, Some(share), &[("cores", "10"), ("memory", "1Gi")])
        })
        .collect();
    let mut c = allocated(claim("ns", name, uid), results, &[pod_uid]);
    c.status.as_mut().unwrap().reserved_for.as_mut().unwrap()[0].name = pod_name.into();
    node.claims.insert(c);
}

fn with_gate(gate: bool) -> TestNode {
    let mut node = TestNode::new();
    let mut config = (*node.config).clone();
    config.gates.set_gate(DraGate::DevicePluginClientMode, gate).unwrap();
    node.config = Arc::new(config);
    node
}

fn spec(node: &TestNode, uid: &str) -> vgpu_core::cdi::Spec {
    serde_json::from_slice(&std::fs::read(node.config.cdi_spec_path(uid)).unwrap()).unwrap()
}

fn env_of(spec: &vgpu_core::cdi::Spec) -> Vec<&str> {
    spec.container_edits
        .env
        .iter()
        .chain(spec.devices.iter().flat_map(|d| d.container_edits.env.iter()))
        .map(String::as_str)
        .collect()
}

fn mounts_of(spec: &vgpu_core::cdi::Spec) -> Vec<(&str, &str)> {
    spec.container_edits
        .mounts
        .iter()
        .chain(spec.devices.iter().flat_map(|d| d.container_edits.mounts.iter()))
        .map(|m| (m.container_path.as_str(), m.host_path.as_str()))
        .collect()
}

/// The fake `/proc` and cgroup tree: this process is in `pod`'s cgroup, which lists it.
fn registry_config(node: &TestNode, pod: &str) -> RegistryConfig {
    let root = node.path("host");
    let me = std::process::id();
    let proc = root.join("proc").join(me.to_string());
    std::fs::create_dir_all(&proc).unwrap();
    std::fs::write(proc.join("cgroup"), format!("0::{}\n", cgroup_of(pod))).unwrap();
    let cgroup = root.join("cgroup").join(cgroup_of(pod).trim_start_matches('/'));
    std::fs::create_dir_all(&cgroup).unwrap();
    std::fs::write(cgroup.join("cgroup.procs"), format!("{me}\n")).unwrap();
    // A unified (cgroup v2) host: `0::<path>` of /proc/<pid>/cgroup names the caller's cgroup.
    std::fs::write(root.join("cgroup/cgroup.controllers"), "cpu memory\n").unwrap();
    RegistryConfig {
        manager_dir: node.config.manager_dir.clone(),
        proc_root: root.join("proc"),
        cgroup_root: root.join("cgroup"),
        cgroup_driver: CgroupDriver::Systemd,
        poll_interval: Duration::from_millis(10),
        poll_timeout: Duration::from_millis(300),
        socket_group: None,
    }
}

fn register(uuid: &str) -> ContainerDeviceRequest {
    ContainerDeviceRequest {
        pod_uid: String::new(),
        container_name: String::new(),
        register_uuid: uuid.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_register_uuid_of_a_prepared_claim_writes_its_partitions_pids() {
    let node = with_gate(true);
    add_claim(&node, "c1", "u1", &[("gpu", "vgpu-0", "s1")], "app", POD);
    node.claims.insert_pod(pod("app", POD, "c1", &[("main", None)]));
    add_claim(&node, "c2", "u2", &[("gpu", "vgpu-1", "s2")], "other", OTHER_POD);
    node.claims.insert_pod(pod("other", OTHER_POD, "c2", &[("main", None)]));
    let state = node.state().await;
    let results = state.prepare(&[ClaimRef::new("ns", "c1", "u1"), ClaimRef::new("ns", "c2", "u2")]).await;
    assert!(results.values().all(Result::is_ok), "{results:?}");

    // One partition, one UUID: checkpoint, annotation, CDI env.
    let key = single_key(&ContainerRef { pod_uid: POD.into(), kind: Kind::App, name: "main".into() });
    let cp = state.checkpoint().await.unwrap();
    let uuids = &cp.claims()["u1"].register_uuids;
    assert_eq!(uuids.values().collect::<Vec<_>>(), [&key]);
    let uuid = uuids.keys().next().unwrap().clone();
    assert_eq!(uuid.len(), 36);
    let annotated = node.claims.get("ns", "c1").await.unwrap().unwrap().metadata.annotations.unwrap();
    assert_eq!(annotated.get(&format!("{DRIVER}/{uuid}")), Some(&key));
    let spec = spec(&node, "u1");
    assert_eq!(vgpu_core::cdi::validate(&spec), Ok(()));
    assert!(!spec.container_edits.env.iter().any(|e| e.starts_with("MANAGER_CLIENT_REGISTER_UUID=")));
    assert!(spec.devices[0].container_edits.env.contains(&format!("MANAGER_CLIENT_REGISTER_UUID={uuid}")));
    let mounts = mounts_of(&spec);
    let host = node.config.host_manager_dir.clone();
    assert!(mounts.contains(&("/etc/vgpu-manager/registry", host.join("registry").to_str().unwrap())));
    assert!(!mounts.iter().any(|(c, _)| *c == "/etc/vgpu-manager/.host_proc"), "no /proc in client mode");
    let part = node.config.host_claim_dir("u1").join(&key).join("config");
    assert!(mounts.contains(&("/etc/vgpu-manager/config", part.to_str().unwrap())), "{mounts:?}");
    let pids = node.config.claim_dir("u1").join(&key).join("config/pids.config");
    assert_eq!(std::fs::read_to_string(&pids).unwrap(), "");

    // The registry, with the plugin's table as its resolver.
    let table = state.register_table();
    assert_eq!(table.len(), 2);
    let running =
        serve_registry_with(registry_config(&node, POD), Duration::from_millis(50), Some(table.clone()))
            .unwrap();
    let mut client =
        VDeviceRegistryClient::new(connect_unix(&running.socket, Duration::from_secs(5)).await.unwrap());
    client.register_container_device(register(&uuid)).await.unwrap();
    assert_eq!(std::fs::read_to_string(&pids).unwrap(), format!("{}\n", std::process::id()));

    // An unknown UUID, a malformed one, and the UUID of another pod's claim.
    let err =
        client.register_container_device(register("00000000-0000-4000-8000-000000000000")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        err.message(),
        "register UUID 00000000-0000-4000-8000-000000000000 names no prepared claim partition on this node"
    );
    let err = client.register_container_device(register("../../etc")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    let theirs =
        state.checkpoint().await.unwrap().claims()["u2"].register_uuids.keys().next().unwrap().clone();
    let err = client.register_container_device(register(&theirs)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(err.message(), format!("caller pod {POD:?} is not authorized for this register request"));
    let their_pids = node.config.claim_dir("u2").join(format!(
        "{}/config/pids.config",
        single_key(&ContainerRef { pod_uid: OTHER_POD.into(), kind: Kind::App, name: "main".into() })
    ));
    assert_eq!(std::fs::read_to_string(&their_pids).unwrap(), "", "untouched");

    // Unprepare: the annotation and the UUID are gone.
    assert!(state.unprepare(&[ClaimRef::new("ns", "c1", "u1")]).await["u1"].is_ok());
    let annotations = node.claims.get("ns", "c1").await.unwrap().unwrap().metadata.annotations.unwrap();
    assert!(!annotations.contains_key(&format!("{DRIVER}/{uuid}")), "{annotations:?}");
    assert!(table.resolve(&uuid).is_none());
    let err = client.register_container_device(register(&uuid)).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    running.stop().await;
}

#[tokio::test]
async fn gate_off_no_register_uuid_anywhere() {
    let node = with_gate(false);
    add_claim(&node, "c1", "u1", &[("gpu", "vgpu-0", "s1")], "app", POD);
    node.claims.insert_pod(pod("app", POD, "c1", &[("main", None)]));
    let state = node.state().await;
    assert!(state.prepare(&[ClaimRef::new("ns", "c1", "u1")]).await["u1"].is_ok());
    let spec = spec(&node, "u1");
    assert!(
        !env_of(&spec).iter().any(|e| e.starts_with("MANAGER_CLIENT_REGISTER_UUID")),
        "{:?}",
        env_of(&spec)
    );
    let mounts = mounts_of(&spec);
    assert!(mounts.contains(&("/etc/vgpu-manager/.host_proc", "/proc")));
    assert!(!mounts.iter().any(|(c, _)| *c == "/etc/vgpu-manager/registry"));
    assert!(state.checkpoint().await.unwrap().claims()["u1"].register_uuids.is_empty());
    assert!(state.register_table().is_empty());
    let annotations = node.claims.get("ns", "c1").await.unwrap().unwrap().metadata.annotations;
    assert!(annotations.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn partitions_follow_the_containers_that_share_requests() {
    let node = with_gate(true);
    // Requests a and b are used by `main` (a) and `side` (a and b): one group. Request c by `solo` alone.
    // Request d by nobody: its own name.
    add_claim(
        &node,
        "c1",
        "u1",
        &[("a", "vgpu-0", "s1"), ("b", "vgpu-1", "s2"), ("c", "vgpu-0", "s3"), ("d/alt", "vgpu-1", "s4")],
        "app",
        POD,
    );
    let mut p = pod("app", POD, "c1", &[("main", Some("a")), ("side", Some("a")), ("solo", Some("c"))]);
    let side = &mut p.spec.as_mut().unwrap().containers[1];
    side.resources
        .as_mut()
        .unwrap()
        .claims
        .as_mut()
        .unwrap()
        .push(k8s_openapi::api::core::v1::ResourceClaim { name: "gpu".into(), request: Some("b".into()) });
    node.claims.insert_pod(p);
    let state = node.state().await;
    let results = state.prepare(&[ClaimRef::new("ns", "c1", "u1")]).await;
    assert_eq!(results["u1"].as_ref().unwrap().len(), 4);

    let app = |name: &str| ContainerRef { pod_uid: POD.into(), kind: Kind::App, name: name.into() };
    let group = group_key(&[app("main"), app("side")], &["a".into(), "b".into()]);
    let solo = single_key(&app("solo"));
    let mut dirs: Vec<String> = walk(&node.config.claim_dir("u1"));
    dirs.sort();
    let mut expected = vec![format!("{group}/config"), format!("{solo}/config"), "d/config".to_owned()];
    expected.sort();
    assert_eq!(dirs, expected);
    // One UUID per partition, and each device's env names its partition's UUID.
    let cp = state.checkpoint().await.unwrap();
    let by_key: BTreeMap<&String, &String> =
        cp.claims()["u1"].register_uuids.iter().map(|(u, k)| (k, u)).collect();
    assert_eq!(by_key.len(), 3);
    let spec = spec(&node, "u1");
    for (device, key) in [("a", &group), ("b", &group), ("c", &solo), ("d", &"d".to_owned())] {
        let d = spec.devices.iter().find(|d| d.name.starts_with(&format!("u1-{device}"))).unwrap();
        assert!(
            d.container_edits.env.contains(&format!("MANAGER_CLIENT_REGISTER_UUID={}", by_key[key])),
            "{device}: {:?}",
            d.container_edits.env
        );
    }
    // Unprepare removes every partition with the claim directory.
    assert!(state.unprepare(&[ClaimRef::new("ns", "c1", "u1")]).await["u1"].is_ok());
    assert!(!node.config.claim_dir("u1").exists());
}

/// Every `config` directory under `root`, relative.
fn walk(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n == "config") {
                    out.push(path.strip_prefix(root).unwrap().display().to_string());
                } else {
                    stack.push(path);
                }
            }
        }
    }
    out
}

/// Unprepare removes its register-UUID annotations only from the claim it prepared: a claim deleted and
/// re-created under the same name (same annotations, another UID) keeps them.
#[tokio::test]
async fn unprepare_leaves_a_claim_recreated_under_the_same_name_alone() {
    let node = with_gate(true);
    add_claim(&node, "c1", "u1", &[("gpu", "vgpu-0", "s1")], "app", POD);
    node.claims.insert_pod(pod("app", POD, "c1", &[("main", None)]));
    let state = node.state().await;
    assert!(state.prepare(&[ClaimRef::new("ns", "c1", "u1")]).await["u1"].is_ok());
    let mut recreated = node.claims.get("ns", "c1").await.unwrap().unwrap();
    assert_eq!(recreated.metadata.annotations.as_ref().map(BTreeMap::len), Some(1), "the register UUID");
    recreated.metadata.uid = Some("u9".into());
    node.claims.insert(recreated.clone());
    assert!(state.unprepare(&[ClaimRef::new("ns", "c1", "u1")]).await["u1"].is_ok());
    assert_eq!(node.claims.get("ns", "c1").await.unwrap().unwrap(), recreated, "untouched");
}

/// Gates `NRISupport` and `DevicePluginClientMode` together (the spec allows the pair): Prepare mints no
/// register UUID (it makes no partition), the NRI hook gives each container partition its own UUID in
/// `MANAGER_CLIENT_REGISTER_UUID`, and the registry, through [`NriRegisterResolver`], writes the caller's
/// PIDs into that container's partition; a UUID of another pod's container is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nri_each_container_partition_registers_through_its_own_uuid() {
    use vgpu_dra::nri::{NriHook, NriRegisterResolver};
    use vgpu_nri::api::{Container as NriContainer, PodSandbox};
    let mut node = with_gate(true);
    let mut config = (*node.config).clone();
    config.gates.set_gate(DraGate::NRISupport, true).unwrap();
    node.config = Arc::new(config);
    let share =
        |dev, s| allocation_result("gpu", DRIVER, NODE, dev, Some(s), &[("cores", "10"), ("memory", "1Gi")]);
    // One claim shared by two pods (allowed with NRI: the partitions are per container).
    let mut c = allocated(claim("ns", "c1", "u1"), vec![share("vgpu-0", "s1")], &[POD, OTHER_POD]);
    c.status.as_mut().unwrap().reserved_for.as_mut().unwrap()[0].name = "app".into();
    c.status.as_mut().unwrap().reserved_for.as_mut().unwrap()[1].name = "other".into();
    node.claims.insert(c);
    let state = node.state().await;
    let results = state.prepare(&[ClaimRef::new("ns", "c1", "u1")]).await;
    assert!(results["u1"].is_ok(), "{results:?}");
    assert!(state.checkpoint().await.unwrap().claims()["u1"].register_uuids.is_empty(), "none at Prepare");
    let spec = spec(&node, "u1");
    assert!(!env_of(&spec).iter().any(|e| e.starts_with("MANAGER_CLIENT_REGISTER_UUID=")), "{spec:?}");
    let host = node.config.host_manager_dir.clone();
    assert!(
        mounts_of(&spec).contains(&("/etc/vgpu-manager/registry", host.join("registry").to_str().unwrap()))
    );

    // CreateContainer of one container in each pod.
    let hook = NriHook::new(Arc::clone(&state));
    let uuid_of = |adjust: &vgpu_nri::api::ContainerAdjustment| {
        adjust.env.iter().find(|kv| kv.key == "MANAGER_CLIENT_REGISTER_UUID").unwrap().value.clone()
    };
    let sandbox = |uid: &str, name: &str| PodSandbox {
        id: format!("sandbox-{uid}"),
        uid: uid.into(),
        name: name.into(),
        namespace: "ns".into(),
        ..Default::default()
    };
    let container = |pod: &PodSandbox| NriContainer {
        id: format!("ctr-{}", pod.uid),
        pod_sandbox_id: pod.id.clone(),
        name: "main".into(),
        env: vec!["MANAGER_VGPU_CLAIM_UID=u1".into()],
        ..Default::default()
    };
    let (mine, theirs) = (sandbox(POD, "app"), sandbox(OTHER_POD, "other"));
    let my_uuid = uuid_of(&hook.adjust(&mine, &container(&mine)).await.unwrap());
    let their_uuid = uuid_of(&hook.adjust(&theirs, &container(&theirs)).await.unwrap());
    assert_eq!(my_uuid.len(), 36, "{my_uuid}");
    assert_ne!(my_uuid, their_uuid);
    assert_eq!(my_uuid, vgpu_dra::nri::register_uuid("u1", POD, "main"));

    let resolver = Arc::new(NriRegisterResolver::new(state.register_table(), hook.cache()));
    let running =
        serve_registry_with(registry_config(&node, POD), Duration::from_millis(50), Some(resolver)).unwrap();
    let mut client =
        VDeviceRegistryClient::new(connect_unix(&running.socket, Duration::from_secs(5)).await.unwrap());
    client.register_container_device(register(&my_uuid)).await.unwrap();
    let pids = node.config.claim_dir("u1").join(format!("{POD}_main/config/pids.config"));
    assert_eq!(std::fs::read_to_string(&pids).unwrap(), format!("{}\n", std::process::id()));
    let err = client.register_container_device(register(&their_uuid)).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{}", err.message());
    let their_pids = node.config.claim_dir("u1").join(format!("{OTHER_POD}_main/config/pids.config"));
    assert_eq!(std::fs::read_to_string(&their_pids).unwrap(), "", "untouched");
    running.stop().await;
}
