//! An SDK user declares the feature gates of their own component (say, a GPU quota operator),
//! with a dependency and an exclusion rule, and validates a configuration before rolling it out.
//!
//! Run: `cargo run --example custom_gates -- 'FairShare=true,StrictQuota=true'`

use std::process::ExitCode;

use vgpu::gates::{Error, Registry};

vgpu::gates::feature_gates! {
    /// Gates of the example quota operator.
    pub enum QuotaGate {
        /// Share idle quota between namespaces.
        FairShare => alpha(false),
        /// Reject pods over quota instead of queueing them.
        StrictQuota => beta(false),
        /// Track usage from vgpu allocations (needed by FairShare).
        UsageTracking => beta(true),
        /// The old v1 admission path.
        LegacyAdmission => deprecated(false),
    }
}

fn main() -> ExitCode {
    let registry = match Registry::builder("quota-operator")
        .gates(QuotaGate::ALL.iter().copied())
        .requires(QuotaGate::FairShare, QuotaGate::UsageTracking)
        .mutually_exclusive(QuotaGate::FairShare, QuotaGate::StrictQuota)
        .renamed("ShareIdle", "FairShare")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bad registry declaration: {e}");
            return ExitCode::FAILURE;
        }
    };

    let value = std::env::args().nth(1).unwrap_or_else(|| "FairShare=true".to_owned());
    match registry.configure([value.as_str()]) {
        Ok(gates) => {
            for w in gates.warnings() {
                println!("warning: {w}");
            }
            println!("--feature-gates={gates} is valid; effective gates:");
            for (name, on) in gates.effective() {
                println!("  {name:<16} {on}");
            }
            if gates.enabled(QuotaGate::FairShare) {
                println!("fair sharing is on");
            }
            ExitCode::SUCCESS
        }
        Err(Error::Validation(v)) => {
            eprintln!("{v}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
