//! The pure pod mutation on UPDATE (`POST /pods/mutate`, operation UPDATE).
//!
//! The architecture has the controller mutate pod create *and* update requests. On CREATE the mutation turns
//! GPUClass resources into ResourceClaims ([`crate::admission::mutate_pod`]). On UPDATE there is nothing of that
//! left to do: a pod's containers' resources, `resourceClaims` and claim references are immutable (the API
//! server refuses a change before any webhook sees it), and the claims exist already. What an update *can*
//! change is the metadata, and one piece of it belongs to the controller:
//!
//! | when | what | why |
//! |---|---|---|
//! | the old pod has the label `<group>/admission-id: <id>` and `spec.resourceClaims`, and the update removes the label or changes its value | the label is set back to `<id>` | it ties the pod to the ResourceClaims its CREATE mutation made: the controller finds the pod of a claim without an owner by it ([`crate::claims`]), and `/pods/validate` allows a generated claim only to the pod with its id ([`crate::pod_validation`]) |
//!
//! Everything else is left as the update wrote it: no other label, annotation or field is touched, an update
//! that keeps the label gets no patch, and a pod that never had the label (no GPUClass request at CREATE) is
//! never given one. Restoring (rather than refusing) is what `kubectl replace` or a `Pod` applied by a tool
//! that does not know the label needs: the update goes through and the pod keeps its claims.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::config::ControllerConfig;

/// The pod as an UPDATE should store it: `new`, with the admission-id label of `old` put back when the update
/// dropped or changed it (module docs). `None` when nothing changes.
pub fn restore_admission_label(config: &ControllerConfig, old: &Pod, new: &Pod) -> Option<Pod> {
    let label = config.admission_label();
    let id = old.labels().get(&label)?;
    let has_claims =
        old.spec.as_ref().and_then(|s| s.resource_claims.as_ref()).is_some_and(|c| !c.is_empty());
    if !has_claims || new.labels().get(&label) == Some(id) {
        return None;
    }
    tracing::info!(
        namespace = ?new.metadata.namespace,
        name = ?new.metadata.name,
        label = %label,
        id = %id,
        "pod update dropped the admission-id label; restoring it"
    );
    let mut restored = new.clone();
    restored.labels_mut().insert(label, id.clone());
    Some(restored)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use super::*;
    use crate::fixture;

    #[test]
    fn only_the_admission_label_is_restored() {
        let config = ControllerConfig::default();
        let old = fixture::pod("ml", "web", "u", "id-1", &["c"]);
        assert_eq!(restore_admission_label(&config, &old, &old), None, "unchanged");

        let mut dropped = old.clone();
        dropped.metadata.labels = Some(BTreeMap::from([("team".to_owned(), "a".to_owned())]));
        let restored = restore_admission_label(&config, &old, &dropped).unwrap();
        assert_eq!(
            restored.metadata.labels,
            Some(BTreeMap::from([
                ("gpu.deckhouse.io/admission-id".to_owned(), "id-1".to_owned()),
                ("team".to_owned(), "a".to_owned()),
            ]))
        );
        assert_eq!(restored.spec, dropped.spec);

        let mut changed = old.clone();
        changed.labels_mut().insert("gpu.deckhouse.io/admission-id".into(), "stolen".into());
        assert_eq!(restore_admission_label(&config, &old, &changed).unwrap().labels(), old.labels());

        let mut none = old.clone();
        none.metadata.labels = None;
        assert_eq!(restore_admission_label(&config, &old, &none).unwrap().labels(), old.labels());

        // No claims (the label was the user's own), or no label before: left alone.
        let mut claimless = old.clone();
        claimless.spec.as_mut().unwrap().resource_claims = None;
        assert_eq!(restore_admission_label(&config, &claimless, &none), None);
        assert_eq!(restore_admission_label(&config, &none, &none), None);
    }
}
