//! The registries match the tables of `shared/spec/feature_gates.md`, written out here
//! independently of the implementation, plus `ConsumableShares` and Kubernetes' three logging gates
//! (`ContextualLogging`, `LoggingAlphaOptions`, `LoggingBetaOptions`), which upstream's DRA registry has and
//! the spec's table omits (contract §9.1).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use vgpu_gates::{Component, Stage};

use Stage::{Alpha, Beta};

fn table(c: Component) -> Vec<(&'static str, bool, Stage)> {
    match c {
        Component::DevicePlugin => vec![
            ("GPUCoreResourcePlugin", false, Alpha),
            ("GPUMemoryResourcePlugin", false, Alpha),
            ("AllocationFailureReschedule", false, Alpha),
            ("TopologyAwareGPUAllocation", false, Alpha),
            ("SharedSMUtilizationWatcher", false, Alpha),
            ("VirtualMemoryTracking", false, Alpha),
            ("DevicePluginClientMode", false, Alpha),
            ("HonorPreAllocatedDeviceIDs", false, Alpha),
        ],
        Component::SchedulerExtender => vec![
            ("SerializedNodeBind", true, Beta),
            ("SerializedNodeFilter", true, Beta),
            ("TopologyAwareGPUAllocation", false, Alpha),
        ],
        Component::DeviceMonitor => {
            vec![("SharedSMUtilizationWatcher", false, Alpha), ("VirtualMemoryTracking", false, Alpha)]
        }
        Component::KubeletPlugin => vec![
            ("VGPUSupport", true, Alpha),
            ("NVMLDeviceHealthCheck", true, Alpha),
            ("IMEXDaemonsWithDNSNames", true, Beta),
            ("TimeSlicingSettings", false, Alpha),
            ("MPSSupport", false, Alpha),
            ("PassthroughSupport", false, Alpha),
            ("DynamicMIG", false, Alpha),
            ("DeviceMetadata", false, Alpha),
            ("SharedSMUtilizationWatcher", false, Alpha),
            ("DevicePluginClientMode", false, Alpha),
            ("NRISupport", false, Alpha),
            ("FabricManagerPartitioning", false, Alpha),
            ("DRAListTypeAttributes", false, Alpha),
            // Not in the spec's table: upstream's DRA registry has it (contract §9.1).
            ("ConsumableShares", false, Alpha),
            // Not in the spec's table either: Kubernetes' logging gates, which upstream's DRA registry adds
            // (k8s.io/component-base v0.37 logs/api/v1 kube_features.go, at emulation version 1.37).
            ("ContextualLogging", true, Beta),
            ("LoggingAlphaOptions", false, Alpha),
            ("LoggingBetaOptions", true, Beta),
        ],
    }
}

#[test]
fn every_component_accepts_exactly_the_spec_gates_with_spec_defaults_and_stages() {
    for c in Component::ALL {
        let got: Vec<(&str, bool, Stage)> = c
            .registry()
            .gate_infos()
            .into_iter()
            .map(|i| {
                assert!(!i.spec.lock_to_default, "{}: no gate of ours is locked", i.name);
                (i.name, i.spec.default, i.spec.stage)
            })
            .collect();
        assert_eq!(got, table(c), "{c}");
    }
}

#[test]
fn defaults_are_the_effective_values_with_no_flags() {
    for c in Component::ALL {
        let configured = c.registry().configure_values(&[]).unwrap();
        let want: std::collections::BTreeMap<&str, bool> =
            table(c).into_iter().map(|(n, d, _)| (n, d)).collect();
        assert_eq!(configured.effective, want, "{c}");
        assert_eq!(configured.canonical, "");
    }
}

#[test]
fn every_spec_gate_can_be_flipped_and_nothing_else_is_accepted() {
    for c in Component::ALL {
        let reg = c.registry();
        for (name, default, _) in table(c) {
            let entries = [(name.to_owned(), !default)];
            match reg.configure_map(&entries) {
                Ok(cfg) => assert_eq!(cfg.effective[name], !default, "{c} {name}"),
                // Flipping a default can break a DRA rule; the set itself was accepted.
                Err(vgpu_gates::Error::Validation(_)) => assert_eq!(c, Component::KubeletPlugin),
                Err(e) => panic!("{c} {name}: {e}"),
            }
        }
        for other in Component::ALL {
            for (name, _, _) in table(other) {
                if table(c).iter().any(|(n, _, _)| *n == name) {
                    continue;
                }
                let err = reg.configure_values(&[&format!("{name}=true")]).unwrap_err().to_string();
                assert_eq!(err.lines().next(), Some(format!("unrecognized feature gate: {name}").as_str()));
                let owners = err
                    .lines()
                    .find_map(|l| l.trim().strip_prefix(&format!("{name} is a gate of ")))
                    .unwrap_or_else(|| panic!("no owner line: {err}"));
                assert!(owners.contains(other.as_str()) && owners.ends_with(&format!("not of {c}")), "{err}");
                assert!(err.contains(&format!("{c} accepts: ")), "{err}");
            }
        }
    }
}

#[test]
fn renamed_gates_are_rejected_with_their_new_name() {
    for (old, new) in vgpu_gates::RENAMED_GATES {
        for c in Component::ALL {
            let err = c.registry().configure_values(&[&format!("{old}=true")]).unwrap_err().to_string();
            let mut lines = err.lines();
            assert_eq!(lines.next(), Some(format!("unrecognized feature gate: {old}").as_str()));
            assert!(err.contains(&format!("{old} was renamed to {new}")), "{err}");
        }
    }
}
