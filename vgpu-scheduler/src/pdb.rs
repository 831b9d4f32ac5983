//! PodDisruptionBudgets for preemption: the light [`PodDisruptionBudget`] and label-selector matching; the
//! budget accounting of kube-scheduler's default preemption is [`crate::budgets`].
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
