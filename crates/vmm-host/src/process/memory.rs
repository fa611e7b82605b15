//! Memory given back to the host: the balloon's figures for the control
//! socket, and the idle reclaim's setting (`idle` asks the agent).

use std::sync::atomic::Ordering;
use std::time::Duration;

use base::host::reclaim::MemoryConfig;
use base::store::StateDir;
use base::vmm::control::ControlResponse;

use super::Shared;

/// How long an answer waits for the guest's fresh statistics.
const STATS_WAIT: Duration = Duration::from_secs(2);

/// The idle time after which the guest is asked to drop its caches, from
/// the state directory's `config.json` (a broken setting falls back to the
/// default, with a warning in the VMM's log).
pub(super) fn reclaim_after(state: &StateDir) -> Option<Duration> {
    let config = MemoryConfig::load(state.root()).unwrap_or_else(|e| {
        tracing::warn!("memory settings unreadable, using the defaults: {e}");
        MemoryConfig::default()
    });
    config.reclaim_after()
}

/// The answer to `memory`.
pub(super) fn figures(shared: &Shared) -> ControlResponse {
    match shared.balloon.get() {
        Some(balloon) => {
            let fresh =
                !shared.paused.load(Ordering::SeqCst) && shared.ready.load(Ordering::SeqCst);
            ControlResponse::Memory {
                balloon: if fresh {
                    balloon.fresh_figures(STATS_WAIT)
                } else {
                    balloon.figures()
                },
            }
        }
        None => ControlResponse::Error {
            message: "this machine has no balloon device".into(),
        },
    }
}
