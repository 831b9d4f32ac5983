//! PodDisruptionBudgets for preemption: the light [`PodDisruptionBudget`], label-selector matching, and the
//! budget accounting of kube-scheduler's default preemption ([`Budgets`]).
//!
//! A victim *violates* a budget when the budget is in the victim's namespace, its selector matches the
//! victim's labels, the victim is not already listed in `status.disruptedPods`, and `status.disruptionsAllowed`
//! drops below zero once every victim counted before it (on the same node) is taken off. Matching follows
//! kube-scheduler (`filterPodsWithPDBViolation`), not the disruption controller: a budget without a selector,
//! with an empty selector or with an invalid one matches nothing, and a pod without labels matches no budget.
//!
//! **Where budgets come from.** [`Cluster::list_pod_disruption_budgets`](crate::Cluster::list_pod_disruption_budgets)
//! is called once per preempt call of a vGPU pod (one paged list of `policy/v1` budgets in all namespaces),
//! not kept by a watch: preemption is rare (only after a filter found no node), a fresh list carries the
//! current `disruptionsAllowed` the disruption controller keeps changing, and the cache driver, readiness and
//! the re-list rules stay about nodes and pods only. When the list fails, preempt still answers, ordering
//! victims without budgets and reporting the scheduler's conservative `NumPDBViolations` bound.

use std::collections::{BTreeMap, BTreeSet};

use crate::cluster::Pod;

/// The operator of a [`SelectorRequirement`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SelectorOperator {
    /// The label is set to one of the values.
    In,
    /// The label is unset or set to none of the values.
    NotIn,
    /// The label is set.
    Exists,
    /// The label is unset.
    DoesNotExist,
}

impl SelectorOperator {
    /// The operator of its API text (`In`, `NotIn`, `Exists`, `DoesNotExist`); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "In" => Some(Self::In),
            "NotIn" => Some(Self::NotIn),
            "Exists" => Some(Self::Exists),
            "DoesNotExist" => Some(Self::DoesNotExist),
            _ => None,
        }
    }
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorRequirement {
    /// Label key.
    pub key: String,
    /// Operator.
    pub operator: SelectorOperator,
    /// Values (`In`/`NotIn` need at least one; `Exists`/`DoesNotExist` none).
    pub values: Vec<String>,
}

impl SelectorRequirement {
    fn valid(&self) -> bool {
        match self.operator {
            SelectorOperator::In | SelectorOperator::NotIn => !self.values.is_empty(),
            SelectorOperator::Exists | SelectorOperator::DoesNotExist => self.values.is_empty(),
        }
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            SelectorOperator::In => value.is_some_and(|v| self.values.contains(v)),
            SelectorOperator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            SelectorOperator::Exists => value.is_some(),
            SelectorOperator::DoesNotExist => value.is_none(),
        }
    }
}

/// A `metav1.LabelSelector`: every `matchLabels` pair and every requirement must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    /// `matchLabels`.
    pub match_labels: BTreeMap<String, String>,
    /// `matchExpressions`.
    pub match_expressions: Vec<SelectorRequirement>,
}

impl LabelSelector {
    /// Whether the selector has no terms (kube-scheduler's preemption then matches nothing).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }

    /// Whether every requirement is well formed (`In`/`NotIn` with values, `Exists`/`DoesNotExist` without).
    pub fn is_valid(&self) -> bool {
        self.match_expressions.iter().all(SelectorRequirement::valid)
    }

    /// Whether the labels satisfy every term (an empty selector matches everything here; callers that
    /// follow kube-scheduler check [`is_empty`](Self::is_empty) first).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }
}

/// A `policy/v1` PodDisruptionBudget as preemption reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodDisruptionBudget {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.selector`; `None` when absent or invalid (an unknown operator): it matches nothing.
    pub selector: Option<LabelSelector>,
    /// `status.disruptionsAllowed` (0 when the status is not written yet).
    pub disruptions_allowed: i32,
    /// Names of `status.disruptedPods`: evictions the API server has admitted and not yet seen happen.
    pub disrupted_pods: BTreeSet<String>,
}

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
