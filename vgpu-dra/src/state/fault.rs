//! Fault injection: the points where a Prepare can be stopped as a crash would ([`FaultPoint`]), the hook
//! tests install ([`FaultHook`], [`DeviceState::with_fault_hook`](super::DeviceState::with_fault_hook)) and
//! the binary's test-only pause ([`TEST_PAUSE_ENV`]).

use std::sync::Arc;

/// Where the fault-injection hook is asked whether to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// `PrepareStarted` is written, nothing else is done.
    AfterPrepareStarted,
    /// The first host action of a mode ([`crate::modes`]) is applied, the others and the files are not.
    AfterHostAction,
    /// Directories and the CDI spec are written, `PrepareCompleted` is not.
    AfterSideEffects,
}

/// The fault-injection hook: called with the point and the claim UID; `true` stops Prepare there without
/// any cleanup, as a crash would.
pub type FaultHook = Arc<dyn Fn(FaultPoint, &str) -> bool + Send + Sync>;

/// **Test only.** The env variable that makes the `vgpu-kubelet-plugin` binary hang at a fault point so a
/// test can SIGKILL it there: `prepare-started` ([`FaultPoint::AfterPrepareStarted`]), `host-action`
/// ([`FaultPoint::AfterHostAction`]) or `side-effects`
/// ([`FaultPoint::AfterSideEffects`]). Never set it in a deployment: the first Prepare that reaches the
/// point blocks forever (its thread sleeps) and holds `pu.lock`.
pub const TEST_PAUSE_ENV: &str = "VGPU_DRA_TEST_PAUSE_AT";

/// **Test only.** The hook of [`TEST_PAUSE_ENV`] when it is set (`None` when unset or empty): at its point
/// it logs, then blocks the calling thread for good, as if the process had stopped there.
pub fn test_pause_hook_from_env() -> Result<Option<FaultHook>, String> {
    let value = std::env::var(TEST_PAUSE_ENV).unwrap_or_default();
    let point = match value.as_str() {
        "" => return Ok(None),
        "prepare-started" => FaultPoint::AfterPrepareStarted,
        "host-action" => FaultPoint::AfterHostAction,
        "side-effects" => FaultPoint::AfterSideEffects,
        other => {
            return Err(format!(
                "{TEST_PAUSE_ENV}={other:?}: expected prepare-started, host-action or side-effects (test only; unset it)"
            ));
        }
    };
    tracing::warn!(env = TEST_PAUSE_ENV, ?point, "test-only fault injection armed: Prepare will hang there");
    Ok(Some(Arc::new(move |at, uid| {
        if at == point {
            tracing::error!(
                ?point,
                claim = uid,
                "{TEST_PAUSE_ENV}: Prepare paused here for good (test only)"
            );
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        false
    })))
}
