//! Memory given back to the host: the balloon's figures for the control
//! socket, and the idle reclaim. Every so often the guest's agent is asked
//! to drop its caches if the guest has been idle long enough (the agent
//! decides: only it knows what runs), and the balloon's free page
//! reporting hands the freed memory to the host.

use std::sync::atomic::Ordering;
use std::sync::Arc;
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

/// Asks the agent to reclaim whenever the guest may have been idle for
/// `after`, until the run ends.
pub(super) fn reclaim_when_idle(shared: &Arc<Shared>, after: Duration) {
    // Often enough that the caches go within a quarter of `after` of the
    // guest going idle; each ask wakes the guest briefly.
    let every = (after / 4).max(Duration::from_secs(5));
    loop {
        std::thread::sleep(every);
        if shared.finished.load(Ordering::SeqCst) || shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        if !shared.ready.load(Ordering::SeqCst) || shared.paused.load(Ordering::SeqCst) {
            continue;
        }
        let asked = shared
            .ws
            .agent_blocking(crate::guest_ready::AGENT_CALL_TIMEOUT)
            .and_then(|agent| agent.reclaim(after.as_secs()));
        match asked {
            Ok(a) if a.dropped => tracing::info!(
                idle_secs = a.idle_secs,
                freed_kib = a.free_kib_after.saturating_sub(a.free_kib_before),
                "the idle guest dropped its caches"
            ),
            Ok(_) => {}
            // An older agent, or one busy shutting down: not worth more noise.
            Err(e) => tracing::debug!("reclaim not done: {e}"),
        }
    }
}
