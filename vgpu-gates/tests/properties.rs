//! Property tests of parsing, rendering and validation, for every component.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use proptest::prelude::*;
use vgpu_gates::{ALL_ALPHA, ALL_BETA, Component, Error, FeatureGate, FeatureGates, Registry};

fn component() -> impl Strategy<Value = Component> {
    prop::sample::select(Component::ALL.to_vec())
}

/// Distinct `(name, value)` settings drawn from the component's gates and the special keys.
fn settings(c: Component) -> impl Strategy<Value = Vec<(String, bool)>> {
    let mut names: Vec<String> = c.gate_names().into_iter().map(str::to_owned).collect();
    names.push(ALL_ALPHA.to_owned());
    names.push(ALL_BETA.to_owned());
    let n = names.len();
    prop::sample::subsequence(names, 0..=n)
        .prop_flat_map(|names| {
            let len = names.len();
            (Just(names), prop::collection::vec(any::<bool>(), len))
        })
        .prop_map(|(names, values)| names.into_iter().zip(values).collect())
        .prop_shuffle()
}

fn render(entries: &[(String, bool)]) -> String {
    entries.iter().map(|(k, v)| format!(" {k} = {v} ")).collect::<Vec<_>>().join(",")
}

fn check_round_trip<G: FeatureGate>(reg: &Registry<G>, value: &str) -> Result<(), TestCaseError> {
    let gates = reg.parse(value).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let canonical = gates.to_string();
    let again = reg.parse(&canonical).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&again, &gates);
    prop_assert_eq!(again.to_string(), canonical.clone());
    let mut sorted: Vec<&str> = canonical.split(',').filter(|s| !s.is_empty()).collect();
    sorted.sort_unstable();
    prop_assert_eq!(sorted.join(","), canonical);
    Ok(())
}

fn check_unknown_rejected<G: FeatureGate>(
    reg: &Registry<G>,
    start: &str,
    value: &str,
    unknown: &str,
) -> Result<(), TestCaseError> {
    let mut gates: FeatureGates<'_, G> = reg.parse(start).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let before = gates.clone();
    let err = gates.set(value).err().ok_or_else(|| TestCaseError::fail("unknown gate accepted"))?;
    prop_assert_eq!(&gates, &before, "a failed set changed the state");
    let text = err.to_string();
    let wanted = format!("unrecognized feature gate: {unknown}");
    prop_assert!(text.lines().any(|l| l == wanted), "{}", text);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn render_parse_round_trip((c, entries) in component().prop_flat_map(|c| (Just(c), settings(c)))) {
        let value = render(&entries);
        match c {
            Component::KubeletPlugin => check_round_trip(vgpu_gates::kubelet_plugin(), &value)?,
            Component::DevicePlugin => check_round_trip(vgpu_gates::device_plugin(), &value)?,
            Component::SchedulerExtender => check_round_trip(vgpu_gates::scheduler_extender(), &value)?,
            Component::DeviceMonitor => check_round_trip(vgpu_gates::device_monitor(), &value)?,
        }
    }

    #[test]
    fn any_unknown_gate_fails_and_changes_nothing(
        (c, start, entries) in component().prop_flat_map(|c| (Just(c), settings(c), settings(c))),
        unknown in "[A-Za-z][A-Za-z0-9]{0,20}",
        at in any::<prop::sample::Index>(),
        value in any::<bool>(),
    ) {
        prop_assume!(!c.gate_names().contains(&unknown.as_str()) && unknown != ALL_ALPHA && unknown != ALL_BETA);
        let mut entries = entries;
        let i = at.index(entries.len() + 1);
        entries.insert(i, (unknown.clone(), value));
        let start = render(&start);
        let value = render(&entries);
        match c {
            Component::KubeletPlugin => check_unknown_rejected(vgpu_gates::kubelet_plugin(), &start, &value, &unknown)?,
            Component::DevicePlugin => check_unknown_rejected(vgpu_gates::device_plugin(), &start, &value, &unknown)?,
            Component::SchedulerExtender => check_unknown_rejected(vgpu_gates::scheduler_extender(), &start, &value, &unknown)?,
            Component::DeviceMonitor => check_unknown_rejected(vgpu_gates::device_monitor(), &start, &value, &unknown)?,
        }
    }

    #[test]
    fn validation_is_independent_of_input_order(
        entries in settings(Component::KubeletPlugin),
        seed in any::<u64>(),
    ) {
        // The same distinct settings in a different order, split over repeated flags.
        let mut shuffled = entries.clone();
        let mut s = seed | 1;
        for i in (1..shuffled.len()).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            shuffled.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let split = shuffled.len() / 2;
        let a = vgpu_gates::kubelet_plugin().configure([render(&entries)]);
        let b = vgpu_gates::kubelet_plugin().configure([render(&shuffled[..split]), render(&shuffled[split..])]);
        match (a, b) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(Error::Validation(a)), Err(Error::Validation(b))) => prop_assert_eq!(a, b),
            (a, b) => prop_assert!(false, "different outcomes: {:?} vs {:?}", a, b),
        }
    }

    #[test]
    fn arbitrary_strings_never_panic_and_failures_change_nothing(s in ".{0,80}") {
        for c in Component::ALL {
            let _ = c.registry().configure_values(&[&s]);
        }
        let mut g = vgpu_gates::kubelet_plugin().parse("MPSSupport=true").unwrap();
        let before = g.clone();
        if g.set(&s).is_err() {
            prop_assert_eq!(g, before);
        }
    }
}
