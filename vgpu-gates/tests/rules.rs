//! DRA start-up validation: every rule of the spec, defaults included.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use vgpu_gates::{DraGate, Error, FeatureGate, Violation, kubelet_plugin};

/// The spec's rules plus upstream's VGPUSupport ⊗ ConsumableShares, written as a plain boolean formula over
/// the 14 driver gates (the three logging gates take part in no rule).
fn spec_accepts(on: impl Fn(DraGate) -> bool) -> bool {
    use DraGate::*;
    let requires = [
        (SharedSMUtilizationWatcher, VGPUSupport),
        (DevicePluginClientMode, VGPUSupport),
        (NRISupport, VGPUSupport),
        (DeviceMetadata, PassthroughSupport),
    ];
    let exclusive = [
        (VGPUSupport, MPSSupport),
        (VGPUSupport, PassthroughSupport),
        (VGPUSupport, ConsumableShares),
        (DynamicMIG, PassthroughSupport),
        (DynamicMIG, NVMLDeviceHealthCheck),
        (DynamicMIG, MPSSupport),
        (PassthroughSupport, NVMLDeviceHealthCheck),
    ];
    requires.iter().all(|&(a, b)| !on(a) || on(b)) && exclusive.iter().all(|&(a, b)| !(on(a) && on(b)))
}

/// The 14 gates of the driver's rules: every DRA gate but the logging ones.
fn driver_gates() -> Vec<DraGate> {
    DraGate::ALL.iter().copied().filter(|g| !DraGate::LOGGING.contains(g)).collect()
}

#[test]
fn exhaustive_over_all_2_pow_14_assignments() {
    let gates = driver_gates();
    assert_eq!(gates.len(), 14);
    assert_eq!(DraGate::ALL.len(), 17);
    let mut accepted = 0;
    for mask in 0u32..(1 << 14) {
        let on = |g: DraGate| match gates.iter().position(|x| *x == g) {
            Some(i) => mask & (1 << i) != 0,
            // The logging gates flip with the mask's lowest bits: they must change no verdict.
            None => mask & (1 << DraGate::LOGGING.iter().position(|x| *x == g).unwrap()) != 0,
        };
        let value: Vec<String> = DraGate::ALL.iter().map(|g| format!("{}={}", g.name(), on(*g))).collect();
        let result = kubelet_plugin().configure([value.join(",")]);
        let want = spec_accepts(on);
        assert_eq!(result.is_ok(), want, "mask {mask:014b}: {value:?} -> {result:?}");
        if let Err(Error::Validation(v)) = &result {
            // Every violation is reported, and the suggestion really satisfies the rules.
            let suggestion = v.suggestion().expect("a consistent combination always exists here");
            let fixed = kubelet_plugin().configure([suggestion]).unwrap();
            assert!(spec_accepts(|g| fixed.enabled(g)));
        } else if let Err(e) = &result {
            panic!("unexpected error {e}");
        }
        accepted += usize::from(want);
    }
    assert!(accepted > 0 && accepted < 1 << 14);
}

#[test]
fn enabling_mps_alone_fails_because_vgpu_support_defaults_on() {
    let err = kubelet_plugin().configure(["MPSSupport=true"]).unwrap_err();
    let Error::Validation(v) = err else { panic!("{err}") };
    assert_eq!(v.violations().len(), 1);
    assert_eq!(
        v.violations()[0].message(),
        "feature gate VGPUSupport is currently mutually exclusive with MPSSupport"
    );
    assert_eq!(v.violations()[0].fix().to_string(), "set VGPUSupport=false");
    assert_eq!(v.suggestion(), Some("MPSSupport=true,VGPUSupport=false"));
    assert!(kubelet_plugin().configure(["MPSSupport=true,VGPUSupport=false"]).is_ok());
}

#[test]
fn all_violations_are_reported_at_once_in_rule_order() {
    let err = kubelet_plugin()
        .configure(["DeviceMetadata=true,PassthroughSupport=true,MPSSupport=true,DynamicMIG=true"])
        .unwrap_err();
    let Error::Validation(v) = err else { panic!("{err}") };
    let messages: Vec<String> = v.violations().iter().map(Violation::message).collect();
    assert_eq!(
        messages,
        [
            "feature gate VGPUSupport is currently mutually exclusive with MPSSupport",
            "feature gate VGPUSupport is currently mutually exclusive with PassthroughSupport",
            "feature gate DynamicMIG is currently mutually exclusive with PassthroughSupport",
            "feature gate DynamicMIG is currently mutually exclusive with NVMLDeviceHealthCheck",
            "feature gate DynamicMIG is currently mutually exclusive with MPSSupport",
            "feature gate PassthroughSupport is currently mutually exclusive with NVMLDeviceHealthCheck",
        ]
    );
    // Both gates of DynamicMIG ⊗ MPSSupport were set explicitly: both are offered.
    assert_eq!(v.violations()[4].fix().to_string(), "set DynamicMIG=false or MPSSupport=false");
    // NVMLDeviceHealthCheck was a default: only it is offered.
    assert_eq!(v.violations()[5].fix().to_string(), "set NVMLDeviceHealthCheck=false");
    let text = v.to_string();
    assert!(text.starts_with("feature gate validation failed for kubelet-plugin:\n"), "{text}");
    assert_eq!(text.lines().count(), 1 + 6 + 1, "{text}");
}

#[test]
fn requires_messages_and_fixes() {
    let err = kubelet_plugin().configure(["NRISupport=true,VGPUSupport=false,MPSSupport=true"]).unwrap_err();
    let Error::Validation(v) = err else { panic!("{err}") };
    assert_eq!(v.violations().len(), 1);
    assert_eq!(
        v.violations()[0].to_string(),
        "feature gate NRISupport requires VGPUSupport to also be enabled; fix: set VGPUSupport=true or NRISupport=false"
    );
}

#[test]
fn all_alpha_counts_as_enabling_for_rules() {
    // AllAlpha=true turns on MPSSupport, PassthroughSupport, DynamicMIG...: many conflicts.
    assert!(kubelet_plugin().configure(["AllAlpha=true"]).is_err());
    // AllAlpha=false turns off every alpha gate, VGPUSupport and NVMLDeviceHealthCheck included.
    let g = kubelet_plugin().configure(["AllAlpha=false"]).unwrap();
    assert!(!g.enabled(DraGate::VGPUSupport) && !g.enabled(DraGate::NVMLDeviceHealthCheck));
    assert!(g.enabled(DraGate::IMEXDaemonsWithDNSNames), "beta gates are untouched");
}

#[test]
fn consumable_shares_excludes_vgpu_support() {
    let err = kubelet_plugin().configure(["ConsumableShares=true"]).unwrap_err();
    let Error::Validation(v) = err else { panic!("{err}") };
    assert_eq!(v.violations().len(), 1);
    assert_eq!(
        v.violations()[0].to_string(),
        "feature gate VGPUSupport is currently mutually exclusive with ConsumableShares; fix: set VGPUSupport=false"
    );
    let gates = kubelet_plugin().configure(["ConsumableShares=true,VGPUSupport=false"]).unwrap();
    assert!(gates.enabled(DraGate::ConsumableShares) && !gates.enabled(DraGate::VGPUSupport));
}

#[test]
fn violations_come_in_upstream_order() {
    // Upstream checks VGPUSupport's exclusions, then the VGPUSupport requirements, then the rest, and
    // DeviceMetadata → PassthroughSupport last.
    let err = kubelet_plugin()
        .configure(["MPSSupport=true,ConsumableShares=true,DeviceMetadata=true,VGPUSupport=true"])
        .unwrap_err();
    let Error::Validation(v) = err else { panic!("{err}") };
    let messages: Vec<String> = v.violations().iter().map(Violation::message).collect();
    assert_eq!(
        messages,
        [
            "feature gate VGPUSupport is currently mutually exclusive with MPSSupport",
            "feature gate VGPUSupport is currently mutually exclusive with ConsumableShares",
            "feature gate DeviceMetadata requires PassthroughSupport to also be enabled",
        ]
    );
    let err = kubelet_plugin()
        .configure(["VGPUSupport=false,NRISupport=true,PassthroughSupport=true"])
        .unwrap_err();
    let Error::Validation(v) = err else { panic!("{err}") };
    let messages: Vec<String> = v.violations().iter().map(Violation::message).collect();
    assert_eq!(
        messages,
        [
            "feature gate NRISupport requires VGPUSupport to also be enabled",
            "feature gate PassthroughSupport is currently mutually exclusive with NVMLDeviceHealthCheck",
        ]
    );
}
