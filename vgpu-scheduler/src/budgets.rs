//! The budget accounting of kube-scheduler's default preemption: whether evicting a pod spends a
//! [`PodDisruptionBudget`] ([`PodDisruptionBudget::covers`]) and what is left of each budget while victims are
//! taken off one by one ([`Budgets`]). The budgets themselves and their selectors are [`crate::pdb`]'s.

use crate::cluster::Pod;
use crate::pdb::PodDisruptionBudget;

impl PodDisruptionBudget {
    /// Whether evicting `pod` spends this budget (same namespace, a non-empty valid selector matching the pod's
    /// non-empty labels, and the pod not already among the disrupted pods).
    pub fn covers(&self, pod: &Pod) -> bool {
        self.namespace == pod.namespace
            && !pod.labels.is_empty()
            && self.selector.as_ref().is_some_and(|s| !s.is_empty() && s.is_valid() && s.matches(&pod.labels))
            && !self.disrupted_pods.contains(&pod.name)
    }
}

/// What is left of each budget while victims are taken off one by one (kube-scheduler's `pdbsAllowed`).
#[derive(Debug, Clone)]
pub struct Budgets<'a> {
    pdbs: &'a [PodDisruptionBudget],
    allowed: Vec<i64>,
}

impl<'a> Budgets<'a> {
    /// Every budget at its `disruptionsAllowed`.
    pub fn new(pdbs: &'a [PodDisruptionBudget]) -> Self {
        Self { pdbs, allowed: pdbs.iter().map(|p| i64::from(p.disruptions_allowed)).collect() }
    }

    /// Takes `pod` off: spends one disruption of every budget covering it; `true` when one of them goes below
    /// zero (the eviction violates it).
    pub fn evict(&mut self, pod: &Pod) -> bool {
        let mut violated = false;
        for (pdb, left) in self.pdbs.iter().zip(self.allowed.iter_mut()) {
            if pdb.covers(pod) {
                *left -= 1;
                violated |= *left < 0;
            }
        }
        violated
    }

    /// How many of `victims`, taken off in order from full budgets, violate one.
    pub fn count_violations<'p>(
        pdbs: &'a [PodDisruptionBudget],
        victims: impl IntoIterator<Item = &'p Pod>,
    ) -> i64 {
        let mut budgets = Self::new(pdbs);
        victims.into_iter().map(|v| i64::from(budgets.evict(v))).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdb::{LabelSelector, SelectorOperator, SelectorRequirement};

    fn labelled(name: &str, ns: &str, labels: &[(&str, &str)]) -> Pod {
        Pod {
            uid: name.to_owned(),
            name: name.to_owned(),
            namespace: ns.to_owned(),
            labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            ..Pod::default()
        }
    }

    fn pdb(ns: &str, selector: Option<LabelSelector>, allowed: i32) -> PodDisruptionBudget {
        PodDisruptionBudget {
            namespace: ns.into(),
            name: "b".into(),
            selector,
            disruptions_allowed: allowed,
            ..Default::default()
        }
    }

    fn app(v: &str) -> LabelSelector {
        LabelSelector { match_labels: [("app".to_owned(), v.to_owned())].into(), ..Default::default() }
    }

    fn expr(key: &str, operator: SelectorOperator, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: vec![SelectorRequirement {
                key: key.into(),
                operator,
                values: values.iter().map(|v| (*v).to_owned()).collect(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn selectors_match_like_kube_scheduler_preemption() {
        let web = labelled("w", "ns", &[("app", "web"), ("tier", "front")]);
        assert!(pdb("ns", Some(app("web")), 0).covers(&web));
        assert!(!pdb("other", Some(app("web")), 0).covers(&web), "namespace must match");
        assert!(!pdb("ns", Some(app("db")), 0).covers(&web));
        assert!(!pdb("ns", None, 0).covers(&web), "nil selector matches nothing");
        assert!(!pdb("ns", Some(LabelSelector::default()), 0).covers(&web), "empty selector matches nothing");
        assert!(!pdb("ns", Some(app("web")), 0).covers(&labelled("x", "ns", &[])), "no labels, no budget");
        let mut disrupted = pdb("ns", Some(app("web")), 0);
        disrupted.disrupted_pods.insert("w".into());
        assert!(!disrupted.covers(&web), "already admitted eviction");
        use SelectorOperator::*;
        assert!(pdb("ns", Some(expr("tier", In, &["front", "back"])), 0).covers(&web));
        assert!(!pdb("ns", Some(expr("tier", NotIn, &["front"])), 0).covers(&web));
        assert!(
            pdb("ns", Some(expr("zone", NotIn, &["a"])), 0).covers(&web),
            "NotIn holds for a missing label"
        );
        assert!(pdb("ns", Some(expr("app", Exists, &[])), 0).covers(&web));
        assert!(!pdb("ns", Some(expr("app", DoesNotExist, &[])), 0).covers(&web));
        assert!(!pdb("ns", Some(expr("tier", In, &[])), 0).covers(&web), "In without values is invalid");
        assert!(
            !pdb("ns", Some(expr("app", Exists, &["web"])), 0).covers(&web),
            "Exists with values is invalid"
        );
        assert_eq!(SelectorOperator::parse("Gt"), None);
        assert_eq!(SelectorOperator::parse("NotIn"), Some(NotIn));
    }

    #[test]
    fn converts_policy_v1_budgets() {
        use crate::convert::pdb_from_k8s;
        let k: k8s_openapi::api::policy::v1::PodDisruptionBudget =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "web", "namespace": "ns"},
                "spec": {"selector": {"matchLabels": {"app": "web"},
                    "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}},
                "status": {"disruptionsAllowed": 2, "disruptedPods": {"w-1": "2026-01-01T00:00:00Z"},
                    "currentHealthy": 3, "desiredHealthy": 1, "expectedPods": 3}
            }))
            .unwrap();
        let p = pdb_from_k8s(&k);
        assert_eq!((p.namespace.as_str(), p.name.as_str(), p.disruptions_allowed), ("ns", "web", 2));
        assert_eq!(p.disrupted_pods, ["w-1".to_owned()].into());
        assert!(p.covers(&labelled("w-2", "ns", &[("app", "web"), ("tier", "front")])));
        assert!(!p.covers(&labelled("w-1", "ns", &[("app", "web")])), "already disrupted");
        let mut k = k;
        k.status = None;
        k.spec.as_mut().unwrap().selector.as_mut().unwrap().match_expressions.as_mut().unwrap()[0].operator =
            "Gt".into();
        let p = pdb_from_k8s(&k);
        assert_eq!(
            (p.disruptions_allowed, p.selector),
            (0, None),
            "no status: nothing allowed; bad operator"
        );
    }

    #[test]
    fn budgets_are_spent_in_victim_order() {
        let pdbs =
            [pdb("ns", Some(app("web")), 1), pdb("ns", Some(expr("tier", SelectorOperator::Exists, &[])), 2)];
        let a = labelled("a", "ns", &[("app", "web")]);
        let b = labelled("b", "ns", &[("app", "web"), ("tier", "x")]);
        let c = labelled("c", "ns", &[("tier", "y")]);
        let mut budgets = Budgets::new(&pdbs);
        assert!(!budgets.evict(&a), "first web pod fits in the budget of 1");
        assert!(budgets.evict(&b), "second web pod violates the web budget");
        assert!(!budgets.evict(&c), "tier budget had 2: b and c");
        assert!(budgets.evict(&c), "a third tier pod violates");
        assert_eq!(Budgets::count_violations(&pdbs, [&a, &b, &c]), 1);
        assert_eq!(Budgets::count_violations(&pdbs, [&c, &b]), 0);
        assert_eq!(Budgets::count_violations(&[], [&a, &b]), 0);
    }
}
