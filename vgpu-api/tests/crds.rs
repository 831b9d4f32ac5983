//! The committed CRD YAML under `deploy/gpu-module/crds/` and `charts/gpu-module/crds/` is exactly what `CustomResourceExt::crd` prints with
//! serde-saphyr (never hand-edited), and the schema carries the list-map conditions and the CEL rules.
//! Regenerate with `VGPU_REGEN=1 cargo test -p vgpu-api --test crds`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{Value, json};
use vgpu_api::{GPUClass, PhysicalGPU, crd_for_group};

fn generated() -> Vec<(String, String)> {
    vgpu_api::crds(vgpu_api::DEFAULT_GROUP)
        .unwrap()
        .into_iter()
        .map(|crd| {
            let name = format!("{}.yaml", crd.metadata.name.clone().unwrap());
            (name, vgpu_api::crd_yaml(&crd).unwrap())
        })
        .collect()
}

#[test]
fn committed_crd_yaml_is_up_to_date() {
    // The same files in the manifests and in the gpu-module chart (Helm installs a chart's `crds/` first).
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let regen = std::env::var_os("VGPU_REGEN").is_some();
    let mut stale = Vec::new();
    for (name, fresh) in generated() {
        for dir in [root.join("deploy/gpu-module/crds"), root.join("charts/gpu-module/crds")] {
            let path = dir.join(&name);
            if regen {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &fresh).unwrap();
                continue;
            }
            if std::fs::read_to_string(&path).unwrap_or_default() != fresh {
                stale.push(path.display().to_string());
            }
        }
    }
    assert!(
        stale.is_empty(),
        "CRD YAML is stale: {stale:?}; run `VGPU_REGEN=1 cargo test -p vgpu-api --test crds` and commit"
    );
}

#[test]
fn committed_yaml_parses_back_to_the_crd() {
    for (_, text) in generated() {
        let parsed: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
        let name = parsed.metadata.name.clone().unwrap();
        let original = if name.starts_with("physicalgpus") { PhysicalGPU::crd() } else { GPUClass::crd() };
        assert_eq!(parsed, original);
    }
}

fn schema(crd: &CustomResourceDefinition) -> Value {
    serde_json::to_value(crd.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap())
        .unwrap()
}

fn rules(v: &Value) -> Vec<String> {
    v["x-kubernetes-validations"]
        .as_array()
        .unwrap_or_else(|| panic!("no rules in {v}"))
        .iter()
        .map(|r| r["rule"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn conditions_are_a_map_keyed_by_type() {
    for crd in [PhysicalGPU::crd(), GPUClass::crd()] {
        let conditions = &schema(&crd)["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], json!("map"), "{conditions}");
        assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
        assert_eq!(conditions["items"]["required"], json!(["status", "type"]));
    }
}

#[test]
fn single_object_rules_are_cel_in_the_schema() {
    let gpu = schema(&PhysicalGPU::crd());
    assert_eq!(
        rules(&gpu["properties"]["spec"]),
        ["self.nodeName == oldSelf.nodeName && self.pciAddress == oldSelf.pciAddress"]
    );
    assert_eq!(
        rules(&gpu["properties"]["status"]["properties"]["occupancy"]),
        ["self.usedShares <= self.totalShares"]
    );
    let class = schema(&GPUClass::crd());
    assert_eq!(
        rules(&class["properties"]["spec"]),
        [
            "self.vendor == oldSelf.vendor",
            "!has(self.passthrough) || !self.passthrough || self.sharing.mode == 'Exclusive'"
        ]
    );
    assert_eq!(
        rules(&class["properties"]["spec"]["properties"]["sharing"]),
        ["self.mode == 'Shared' ? (has(self.shares) && self.shares >= 2) : !has(self.shares)"]
    );
}

#[test]
fn the_stream_holds_both_files_and_follows_the_group() {
    let committed: Vec<String> = generated().into_iter().map(|(_, text)| text).collect();
    assert_eq!(vgpu_api::crds_yaml("gpu.deckhouse.io").unwrap(), committed.join("---\n"));
    let other = vgpu_api::crds_yaml("gpu.example.com").unwrap();
    assert!(other.contains("name: physicalgpus.gpu.example.com") && other.contains("group: gpu.example.com"));
    assert!(
        !other.contains("group: gpu.deckhouse.io") && !other.contains("name: physicalgpus.gpu.deckhouse.io")
    );
    assert!(matches!(vgpu_api::crds_yaml("bad"), Err(vgpu_api::CrdYamlError::Group(_))));
}

#[test]
fn another_group_changes_only_group_and_name() {
    let moved = crd_for_group(PhysicalGPU::crd(), "gpu.example.com").unwrap();
    let mut back = moved.clone();
    back.spec.group = "gpu.deckhouse.io".into();
    back.metadata.name = Some("physicalgpus.gpu.deckhouse.io".into());
    assert_eq!(back, PhysicalGPU::crd());
    assert_eq!(moved.spec.names.short_names, Some(vec!["pgpu".to_owned()]));
}
