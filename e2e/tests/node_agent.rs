//! `vgpu-node-agent` against the real API server (issue #20 §2): the generated CRDs from
//! `deploy/gpu-module/crds/` are created and become Established, the sample `gpu-supported-vendors`
//! ConfigMap is created, and the binary scans a fake sysfs tree with two NVIDIA GPUs, one MetaX GPU and one
//! NIC. The schema's CEL rules are checked on GPUClass objects (an invalid sharing policy and a vendor change
//! are rejected with their messages). Read back from the API server: exactly three PhysicalGPUs (spec from `pci.ids`, status written
//! through `/status` by the agent's field manager) and the vendor labels on the Node; a device removed
//! from the tree loses its PhysicalGPU at the next scan. A control-plane node is refused (exit 1, message).
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, fs, path::Path, time::Duration};

use k8s_openapi::{
    api::core::v1::{ConfigMap, Node},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api,
    api::{DynamicObject, ListParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use vgpu_e2e::{TestEnv, vgpu_binary};
use vgpu_node_agent::fake_sysfs::FakeSysfs;

const NODE: &str = "agent-node";
const CONTROL_PLANE_NODE: &str = "agent-cp";
fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": name, "labels": labels }
    }))
    .unwrap()
}

async fn gpu_names(gpus: &Api<DynamicObject>) -> Vec<String> {
    let list = gpus.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    let mut names: Vec<String> = list.into_iter().filter_map(|o| o.metadata.name).collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn node_agent_keeps_one_physical_gpu_per_gpu_and_the_vendor_labels() {
    let mut env = TestEnv::builder("node_agent_keeps_one_physical_gpu_per_gpu_and_the_vendor_labels")
        .start()
        .await
        .unwrap();
    let client = env.client().await.unwrap();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gpu-module");

    // The generated CRDs, as committed.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in ["physicalgpus.gpu.deckhouse.io.yaml", "gpuclasses.gpu.deckhouse.io.yaml"] {
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&fs::read_to_string(deploy.join("crds").join(file)).unwrap()).unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    for name in ["physicalgpus.gpu.deckhouse.io", "gpuclasses.gpu.deckhouse.io"] {
        env.poll(&format!("CRD {name} Established"), Duration::from_secs(30), || {
            let crds = crds.clone();
            async move {
                let crd = crds.get(name).await.ok()?;
                let established =
                    crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True");
                established.then_some(())
            }
        })
        .await
        .unwrap();
    }

    // The CEL rules in the schema are enforced by the API server itself.
    let class_ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gpu.deckhouse.io", "v1alpha1", "GPUClass"),
        "gpuclasses",
    );
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &class_ar);
    let class = |name: &str, vendor: &str, sharing: serde_json::Value| -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": { "name": name },
            "spec": { "vendor": vendor, "sharing": sharing }
        }))
        .unwrap()
    };
    let err = classes
        .create(&PostParams::default(), &class("bad", "nvidia", serde_json::json!({ "mode": "Shared" })))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Shared needs shares >= 2"), "{err}");
    classes
        .create(
            &PostParams::default(),
            &class("a100-shared", "nvidia", serde_json::json!({ "mode": "Shared", "shares": 4 })),
        )
        .await
        .unwrap();
    let mut changed = classes.get("a100-shared").await.unwrap();
    changed.data["spec"]["vendor"] = serde_json::json!("metax");
    let err = classes.replace("a100-shared", &PostParams::default(), &changed).await.unwrap_err();
    assert!(err.to_string().contains("vendor is immutable"), "{err}");

    // The sample vendors ConfigMap (in `default`), a worker node and a control-plane node.
    let mut cm: ConfigMap =
        serde_saphyr::from_str(&fs::read_to_string(deploy.join("gpu-supported-vendors.yaml")).unwrap())
            .unwrap();
    cm.metadata.namespace = Some("default".into());
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node(NODE, &[("other", "kept")])).await.unwrap();
    nodes
        .create(
            &PostParams::default(),
            &node(CONTROL_PLANE_NODE, &[("node-role.kubernetes.io/control-plane", "")]),
        )
        .await
        .unwrap();

    // The fake sysfs: two NVIDIA A100s, one MetaX MXC500, one Intel NIC.
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeSysfs::create(dir.path()).unwrap();
    fake.two_nvidia_one_metax_one_nic().unwrap();
    let sys = fake.sysfs_root();

    let binary = vgpu_binary("vgpu-node-agent").unwrap();
    let args = |node: &str| -> Vec<String> {
        [
            "--node-name",
            node,
            "--sysfs-root",
            sys.to_str().unwrap(),
            "--pci-ids",
            fake.pci_ids().to_str().unwrap(),
            "--scan-interval",
            "500ms",
            "--vendors-configmap",
            "default/gpu-supported-vendors",
            "--kubeconfig",
            env.kubeconfig_path().to_str().unwrap(),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };

    // A control-plane node is refused before anything is written.
    let refused = std::process::Command::new(&binary).args(args(CONTROL_PLANE_NODE)).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("control-plane") && stderr.contains("--allow-control-plane"), "{stderr}");

    env.start_process("vgpu-node-agent", &binary, &args(NODE), &[]).unwrap();
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gpu.deckhouse.io", "v1alpha1", "PhysicalGPU"),
        "physicalgpus",
    );
    let gpus: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let a = "agent-node-nvidia-20b0-0000-3b-00-0";
    let b = "agent-node-nvidia-20b0-0000-86-00-0";
    let m = "agent-node-metax-4001-0000-5e-00-0";
    let mut expected = vec![m.to_owned(), a.to_owned(), b.to_owned()];
    expected.sort();
    env.poll("three PhysicalGPUs with status", Duration::from_secs(30), || {
        let gpus = gpus.clone();
        let expected = expected.clone();
        async move {
            let names = gpu_names(&gpus).await;
            let all_have_status = {
                let mut ok = true;
                for name in &names {
                    ok &= gpus.get(name).await.ok().is_some_and(|o| o.data.get("status").is_some());
                }
                ok
            };
            (names == expected && all_have_status).then_some(())
        }
    })
    .await
    .unwrap();
    env.check_process("vgpu-node-agent").unwrap();

    let metax = gpus.get(m).await.unwrap();
    let spec = &metax.data["spec"];
    assert_eq!(spec["nodeName"], NODE);
    assert_eq!(spec["vendor"], "metax");
    assert_eq!(spec["deviceName"], "MXC500");
    assert_eq!(spec["pciAddress"], "0000:5e:00.0");
    assert_eq!(spec["index"], 1);
    let status = &metax.data["status"];
    assert_eq!(status["driver"], "metax");
    assert_eq!(status["conditions"][0]["type"], "DriverBound");
    assert_eq!(status["conditions"][0]["status"], "True");
    let labels = metax.metadata.labels.clone().unwrap();
    assert_eq!(labels["gpu.deckhouse.io/vendor"], "metax");
    let managers: Vec<(String, Option<String>)> = metax
        .metadata
        .managed_fields
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| (m.manager.unwrap_or_default(), m.subresource))
        .collect();
    assert!(managers.contains(&("vgpu-node-agent".to_owned(), None)), "{managers:?}");
    assert!(managers.contains(&("vgpu-node-agent".to_owned(), Some("status".to_owned()))), "{managers:?}");
    let a100 = gpus.get(a).await.unwrap();
    assert_eq!(a100.data["spec"]["deviceName"], "GA100 [A100 SXM4 40GB]");
    assert_eq!(a100.data["spec"]["model"], "a100-sxm4-40gb");

    let node_labels = |want: Vec<(&'static str, &'static str)>| {
        let nodes = nodes.clone();
        move || {
            let nodes = nodes.clone();
            let want = want.clone();
            async move {
                let labels = nodes.get(NODE).await.ok()?.metadata.labels?;
                let vendor_labels: Vec<(String, String)> = labels
                    .iter()
                    .filter(|(k, _)| k.starts_with("gpu.deckhouse.io/"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let want: Vec<(String, String)> =
                    want.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
                (vendor_labels == want && labels.get("other").map(String::as_str) == Some("kept"))
                    .then_some(())
            }
        }
    };
    env.poll(
        "the vendor labels on the node",
        Duration::from_secs(30),
        node_labels(vec![
            ("gpu.deckhouse.io/vendor", "nvidia"),
            ("gpu.deckhouse.io/vendor.metax", "true"),
            ("gpu.deckhouse.io/vendor.nvidia", "true"),
        ]),
    )
    .await
    .unwrap();

    // The MetaX GPU leaves: its PhysicalGPU and its label go at the next scan.
    fake.remove("0000:5e:00.0").unwrap();
    let mut remaining = vec![a.to_owned(), b.to_owned()];
    remaining.sort();
    env.poll("the MetaX PhysicalGPU deleted", Duration::from_secs(30), || {
        let gpus = gpus.clone();
        let remaining = remaining.clone();
        async move { (gpu_names(&gpus).await == remaining).then_some(()) }
    })
    .await
    .unwrap();
    env.poll(
        "the MetaX label removed",
        Duration::from_secs(30),
        node_labels(vec![("gpu.deckhouse.io/vendor", "nvidia"), ("gpu.deckhouse.io/vendor.nvidia", "true")]),
    )
    .await
    .unwrap();
    assert_eq!(gpus.get(b).await.unwrap().data["spec"]["index"], 1, "B moved up in PCI order, same name");

    env.check_process("vgpu-node-agent").unwrap();
    env.stop_process("vgpu-node-agent").unwrap();
    env.finish();
}
