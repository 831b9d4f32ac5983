//! Properties of the pure Volcano Job conversion (`volcano::job_patch`) over arbitrary Jobs and configurations:
//! it never panics; its patch applies to the Job as received and yields exactly the converted Job; every
//! container claim reference of a converted task resolves to a `resourceClaimTemplateName` entry of its
//! template; no two tasks share a template; the record round-trips and is accepted by the validating side
//! (`volcano::planned_templates`, one template per recorded claim); and converting again changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use vgpu_webhook::config::WebhookConfig;
use vgpu_webhook::volcano::{self, VolcanoJob};

const RESOURCES: &[&str] =
    &["nvidia.com/vgpu-number", "nvidia.com/vgpu-cores", "nvidia.com/vgpu-memory", "cpu"];

fn quantity() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => prop::sample::select(vec!["0", "1", "2", "16", "50", "100", "4096"]).prop_map(str::to_owned),
        1 => prop::sample::select(vec!["17", "101", "1.5", "x"]).prop_map(str::to_owned),
    ]
}

fn container(name: &'static str) -> impl Strategy<Value = Value> {
    prop::collection::btree_map(prop::sample::select(RESOURCES.to_vec()), quantity(), 0..4).prop_map(
        move |l| {
            let limits: Map<String, Value> =
                l.into_iter().map(|(k, v)| (k.to_owned(), Value::String(v))).collect();
            json!({"name": name, "resources": {"limits": limits}})
        },
    )
}

fn task() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["", "a", "b", "a-b", "worker", "worker"]),
        prop::collection::vec(prop::sample::select(vec!["main", "b-main", "side"]), 1..3),
        prop::option::of(container("init")),
        any::<u8>(),
    )
        .prop_flat_map(|(name, names, init, replicas)| {
            let unique: BTreeSet<&'static str> = names.into_iter().collect();
            let containers: Vec<_> = unique.into_iter().map(container).collect();
            (Just(name), containers, Just(init), Just(replicas))
        })
        .prop_map(|(name, containers, init, replicas)| {
            let mut spec = json!({"containers": containers, "restartPolicy": "Never"});
            if let Some(i) = init {
                spec["initContainers"] = json!([i]);
            }
            let mut t =
                json!({"replicas": replicas, "template": {"metadata": {"labels": {"x": "y"}}, "spec": spec}});
            if !name.is_empty() {
                t["name"] = json!(name);
            }
            t
        })
}

fn job() -> impl Strategy<Value = Value> {
    (prop::collection::vec(task(), 0..4), any::<bool>()).prop_map(|(tasks, generated)| {
        let metadata = if generated {
            json!({"generateName": "train-", "namespace": "ml", "uid": "uid-1"})
        } else {
            json!({"name": "train", "namespace": "ml", "uid": "uid-1"})
        };
        json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": metadata,
            "spec": {"minAvailable": 1, "queue": "q", "tasks": tasks}})
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn conversion_invariants(raw in job(), combined in any::<bool>()) {
        let config = WebhookConfig { convert_to_dra: true, combined_claim: combined, ..WebhookConfig::default() };
        let job = VolcanoJob::from_value(&raw).unwrap();
        let Ok(patch) = volcano::job_patch(&config, "u-1", &job) else { return Ok(()) };
        let converted = volcano::mutate_job(&config, "u-1", &job).unwrap();

        let mut patched = raw.clone();
        json_patch::patch(&mut patched, &patch).unwrap();
        let reread = VolcanoJob::from_value(&patched).unwrap();
        prop_assert_eq!(&reread, &converted);
        // Only metadata and the task templates changed.
        prop_assert_eq!(&patched["spec"]["minAvailable"], &raw["spec"]["minAvailable"]);
        for (before, after) in raw["spec"]["tasks"].as_array().unwrap().iter().zip(patched["spec"]["tasks"].as_array().unwrap()) {
            prop_assert_eq!(&before["replicas"], &after["replicas"]);
        }

        let Some(record) = volcano::job_record(&converted) else {
            prop_assert!(patch.0.is_empty());
            return Ok(());
        };
        let record = record.unwrap();
        let text = converted.metadata.annotations.as_ref().unwrap()["vgpu-manager.io/original-resources"].clone();
        prop_assert_eq!(volcano::encode_job_record(&record), text);

        let mut owners: BTreeMap<String, String> = BTreeMap::new();
        for (task_name, infos) in &record {
            let (_, task) = converted.task(task_name).unwrap();
            let spec = task.template.as_ref().unwrap().spec.as_ref().unwrap();
            let mut entries: BTreeSet<&str> = BTreeSet::new();
            for p in spec.resource_claims.iter().flatten() {
                prop_assert_eq!(p.resource_claim_template_name.as_deref(), Some(p.name.as_str()));
                entries.insert(p.name.as_str());
            }
            for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
                for r in c.resources.as_ref().and_then(|r| r.claims.as_ref()).into_iter().flatten() {
                    prop_assert!(entries.contains(r.name.as_str()), "{} not in {:?}", r.name, entries);
                }
            }
            for info in infos {
                prop_assert!(entries.contains(info.claim_name.as_str()));
                let other = owners.insert(info.claim_name.clone(), task_name.clone());
                prop_assert!(other.is_none_or(|o| o == *task_name), "{} shared", info.claim_name);
            }
        }

        let mut named = converted.clone();
        named.metadata.name.get_or_insert_with(|| "train-xyz12".to_owned());
        let templates = volcano::planned_templates(&config, &named, &record, 1).unwrap();
        prop_assert_eq!(templates.len(), volcano::record_template_names(&record).len());

        // Converting again changes nothing.
        prop_assert!(volcano::job_patch(&config, "u-2", &converted).unwrap().0.is_empty());
    }
}
