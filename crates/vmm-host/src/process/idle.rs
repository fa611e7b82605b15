//! A guest with nothing to do costs the host nothing: once nothing has
//! reached it for long enough, its agent is asked (it decides, since only
//! it knows what runs), and an idle guest drops its caches (the balloon
//! hands the memory back) or, after its `idle_pause`, has its vCPUs and
//! devices stopped. The next host program to reach its vsock socket (a
//! call through the agent, a published port's connection, a terminal)
//! resumes it before it is served: it sees only the latency. Pauses on
//! request (`pause`, a pool) wait for `resume`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base::host::settings::now_ms;
use base::store::events::EventKind;
use base::store::spec::PauseCause;
use vmm_core::devices::virtio::vsock::{HostArrivals, CLOSE_TIMEOUT};

use super::Shared;

/// How long the paused watcher sleeps between looks at a pause ended on
/// request or a run that ended (an arrival ends the sleep at once).
const PAUSED_LOOK: Duration = Duration::from_secs(5);
/// How long the check's own connection may take to close before a pause:
/// a starved guest may be slow to close its side, and the device then
/// closes it after its own close timeout.
const SETTLE: Duration = CLOSE_TIMEOUT.saturating_add(Duration::from_secs(1));
/// How long an idle check may take. Longer than other calls: a check the
/// VMM gave up on still ran in the guest, and a guest with little of a
/// loaded host's CPU, asked again before it had answered, never went
/// idle (its ticks go on while it has work, and on an emulating host each
/// costs it milliseconds), so no guest of 25 at once on 2 CPUs paused.
const CHECK_TIMEOUT: Duration = Duration::from_secs(180);

/// When an idle guest drops its caches, when it pauses, and how long
/// after the pause it hibernates.
#[derive(Clone, Copy, Debug)]
pub(super) struct IdlePolicy {
    pub reclaim_after: Option<Duration>,
    pub pause_after: Option<Duration>,
    pub hibernate_after_pause: Option<Duration>,
}

impl IdlePolicy {
    /// From the settings: a guest that hibernates pauses first (when it
    /// has no earlier pause, at its hibernation time), and hibernates
    /// once idle for `hibernate_after` in all.
    pub fn new(
        reclaim_after: Option<Duration>,
        pause_after: Option<Duration>,
        hibernate_after: Option<Duration>,
    ) -> Self {
        let pause_after = match (pause_after, hibernate_after) {
            (Some(p), Some(h)) => Some(p.min(h)),
            (p, h) => p.or(h),
        };
        Self {
            reclaim_after,
            pause_after,
            hibernate_after_pause: hibernate_after
                .zip(pause_after)
                .map(|(h, p)| h.saturating_sub(p)),
        }
    }

    /// How often the watcher looks (the agent is asked only once nothing
    /// has arrived for a whole setting): a quarter of the shorter setting,
    /// so the guest goes within a quarter of it of being idle; None when
    /// neither is set.
    fn every(&self) -> Option<Duration> {
        [self.reclaim_after, self.pause_after]
            .into_iter()
            .flatten()
            .map(|after| (after / 4).max(Duration::from_secs(1)))
            .min()
    }
}

/// What the host side has seen of the guest's use: every call, connection
/// and terminal arrives on its vsock socket, so the agent (whose answer
/// costs the guest's kernel work, emulated on some hosts) is only asked
/// once nothing has arrived for as long as a pause or a reclaim needs.
struct Quiet {
    /// The socket's count of accepted connections when last looked at.
    seen: u64,
    since: Instant,
    /// The caches were dropped (or found dropped) in this quiet spell.
    reclaimed: bool,
}

impl Quiet {
    fn new() -> Self {
        Self {
            seen: 0,
            since: Instant::now(),
            reclaimed: false,
        }
    }

    /// How long nothing has arrived and no connection has been open, from
    /// the socket's counts (accepted, open) now.
    fn look(&mut self, counts: Option<(u64, usize)>) -> Duration {
        if let Some((accepted, open)) = counts {
            if accepted != self.seen || open > 0 {
                self.seen = accepted;
                self.since = Instant::now();
                self.reclaimed = false;
            }
        }
        self.since.elapsed()
    }

    /// The watcher's own ask (the one connection accepted since the last
    /// look) is not use; whether nothing else came meanwhile (when
    /// something did, the quiet starts again at the next look).
    fn asked(&mut self, accepted: Option<u64>) -> bool {
        let Some(accepted) = accepted else {
            return true;
        };
        let own_only = accepted == self.seen + 1;
        if own_only {
            self.seen = accepted;
        }
        own_only
    }
}

/// Watches the guest until the run ends.
pub(super) fn watch(shared: &Arc<Shared>, policy: IdlePolicy) {
    let Some(every) = policy.every() else {
        return;
    };
    // Never dropped when only the pause is set.
    let reclaim_secs = policy.reclaim_after.map_or(u64::MAX, |d| d.as_secs());
    let mut quiet = Quiet::new();
    // A check the guest could not answer in time costs it as much again:
    // the next waits longer, up to four times as long.
    let longest = every * 4;
    let mut wait = every;
    loop {
        std::thread::sleep(wait);
        if shared.finished.load(Ordering::SeqCst) {
            return;
        }
        if !shared.ready.load(Ordering::SeqCst)
            || shared.paused.load(Ordering::SeqCst)
            || shared.stopping.load(Ordering::SeqCst)
        {
            continue;
        }
        let arrivals = shared.arrivals.get().map(Arc::as_ref);
        let quiet_for = quiet.look(arrivals.map(|a| (a.accepted(), a.open())));
        let pause_due = policy.pause_after.is_some_and(|after| quiet_for >= after);
        let reclaim_due =
            !quiet.reclaimed && policy.reclaim_after.is_some_and(|after| quiet_for >= after);
        if !pause_due && !reclaim_due {
            continue;
        }
        let asked = shared
            .ws
            .agent_blocking(CHECK_TIMEOUT)
            .and_then(|agent| agent.reclaim(reclaim_secs));
        // A host program that came during the ask (which can be long) may
        // have started what the answer, made before, does not know of.
        let undisturbed = quiet.asked(arrivals.map(HostArrivals::accepted));
        let answer = match asked {
            Ok(a) => a,
            // An agent busy shutting down: not worth more noise.
            Err(e) => {
                wait = (wait * 2).min(longest);
                tracing::debug!(next_in = ?wait, "idle check not done: {e}");
                continue;
            }
        };
        wait = every;
        tracing::debug!(
            idle_secs = answer.idle_secs,
            busy = ?answer.busy,
            because = ?answer.busy_because,
            "idle check"
        );
        if answer.dropped {
            tracing::info!(
                idle_secs = answer.idle_secs,
                freed_kib = answer.free_kib_after.saturating_sub(answer.free_kib_before),
                "the idle guest dropped its caches"
            );
        }
        // An agent that does not say is taken as busy.
        let idle = answer.busy == Some(false);
        if reclaim_due && (answer.dropped || idle) {
            quiet.reclaimed = true;
        }
        let idle_long_enough = policy
            .pause_after
            .is_some_and(|after| answer.idle_secs >= after.as_secs());
        if !pause_due || !idle_long_enough || !idle || !undisturbed {
            continue;
        }
        let Some(arrivals) = arrivals else {
            continue;
        };
        if let Some(paused_at) = pause_idle(shared, arrivals, quiet.seen, answer.idle_secs) {
            let hibernate_at = policy.hibernate_after_pause.map(|d| paused_at + d);
            wait_paused(shared, arrivals, paused_at, hibernate_at);
        }
    }
}

/// Pauses the idle guest unless a host program arrived since the check
/// (`seen`: the accept count with the check's own connection); when it
/// paused.
fn pause_idle(
    shared: &Shared,
    arrivals: &HostArrivals,
    seen: u64,
    idle_secs: u64,
) -> Option<Instant> {
    // The check's own connection closes first; one that stays open is
    // someone else's.
    let settling = Instant::now();
    while arrivals.open() > 0 {
        if settling.elapsed() > SETTLE || arrivals.accepted() != seen {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let machine = shared.machine.get()?;
    if shared.stopping.load(Ordering::SeqCst) || shared.finished.load(Ordering::SeqCst) {
        return None;
    }
    // Recorded before the vCPUs stop, so no lock is ever waited on while
    // the guest cannot answer whoever holds it.
    record(shared, Some(PauseCause::Idle));
    let _turn = shared.transition.lock().unwrap_or_else(|p| p.into_inner());
    let paused = !shared.paused.load(Ordering::SeqCst)
        && !shared.stopping.load(Ordering::SeqCst)
        && machine.pause().is_ok();
    // An arrival in between (already accepted, so the socket no longer
    // shows it) is served at once.
    let arrived = arrivals.accepted() != seen || arrivals.open() > 0;
    if !paused {
        drop(_turn);
        record(shared, None);
        return None;
    }
    shared.paused.store(true, Ordering::SeqCst);
    shared.idle_paused.store(true, Ordering::SeqCst);
    if arrived {
        match machine.resume() {
            Ok(()) => {
                shared.paused.store(false, Ordering::SeqCst);
                shared.idle_paused.store(false, Ordering::SeqCst);
                drop(_turn);
                record(shared, None);
                return None;
            }
            // Paused it stays, and the arrival waits on the watch below,
            // which tries again.
            Err(e) => tracing::error!("resuming after a pause that raced a call: {e}"),
        }
    }
    drop(_turn);
    tracing::info!(idle_secs, "paused the idle guest");
    if let Err(e) = shared.ws.events().append(EventKind::Paused {
        cause: PauseCause::Idle,
    }) {
        tracing::warn!("cannot record the pause: {e}");
    }
    Some(Instant::now())
}

/// Waits while the guest is paused: resumes it when a host program
/// arrives while the pause is the idle one, hibernates it at
/// `hibernate_at` if nothing did; a pause on request in between waits for
/// its `resume`.
fn wait_paused(
    shared: &Arc<Shared>,
    arrivals: &HostArrivals,
    paused_at: Instant,
    mut hibernate_at: Option<Instant>,
) {
    let mut retry = Duration::from_millis(100);
    let mut requested_recorded = false;
    let by = loop {
        if shared.finished.load(Ordering::SeqCst) {
            return;
        }
        if !shared.paused.load(Ordering::SeqCst) {
            break "request";
        }
        if !shared.idle_paused.load(Ordering::SeqCst) {
            // Paused again on request: arrivals wait for its `resume`.
            if !requested_recorded {
                record(shared, Some(PauseCause::Requested));
                requested_recorded = true;
            }
            std::thread::sleep(PAUSED_LOOK);
            continue;
        }
        let look = hibernate_at.map_or(PAUSED_LOOK, |at| {
            at.saturating_duration_since(Instant::now())
                .min(PAUSED_LOOK)
        });
        match arrivals.wait(look) {
            Ok(false) if hibernate_at.is_some_and(|at| Instant::now() >= at) => {
                match super::hibernate::hibernate(shared, Some(arrivals)) {
                    Ok(_) => return,
                    // Paused it stays; not tried again this spell.
                    Err(why) => {
                        tracing::warn!(%why, "the idle guest stays paused");
                        hibernate_at = None;
                    }
                }
                continue;
            }
            Ok(false) => continue,
            Ok(true) => {}
            // Woken anyway: a guest that runs costs CPU, one that cannot
            // be reached loses its caller's work.
            Err(e) => tracing::warn!("cannot watch for calls while paused: {e}"),
        }
        let _turn = shared.transition.lock().unwrap_or_else(|p| p.into_inner());
        if !shared.idle_paused.load(Ordering::SeqCst) {
            continue;
        }
        let Some(machine) = shared.machine.get() else {
            return;
        };
        match machine.resume() {
            Ok(()) => {
                shared.paused.store(false, Ordering::SeqCst);
                shared.idle_paused.store(false, Ordering::SeqCst);
                break "a call";
            }
            Err(e) => {
                // Threads that cannot start yet (the pids limit, memory):
                // tried again, less often each time.
                tracing::error!("cannot resume the idle guest for a call: {e}");
                drop(_turn);
                std::thread::sleep(retry);
                retry = (retry * 2).min(PAUSED_LOOK);
            }
        }
    };
    let paused_ms = paused_at.elapsed().as_millis() as u64;
    tracing::info!(by, paused_ms, "the guest runs again");
    record(shared, None);
    if let Err(e) = shared.ws.events().append(EventKind::Resumed {
        by: by.into(),
        paused_ms,
    }) {
        tracing::warn!("cannot record the resume: {e}");
    }
}

/// Records in the workspace's runtime whether, and why, it is paused.
fn record(shared: &Shared, cause: Option<PauseCause>) {
    let recorded = shared.update(|m| {
        if let Some(rt) = m.runtime.as_mut() {
            rt.paused = cause;
            rt.paused_at_ms = cause.map(|_| now_ms());
        }
        Ok(())
    });
    if let Err(e) = recorded {
        tracing::warn!(error = %e.full_message(), "cannot record the pause state");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_is_asked_every_quarter_of_the_shorter_setting() {
        let secs = |s| Some(Duration::from_secs(s));
        let every =
            |reclaim_after, pause_after| IdlePolicy::new(reclaim_after, pause_after, None).every();
        assert_eq!(every(None, None), None);
        assert_eq!(every(secs(600), None), secs(150));
        assert_eq!(every(secs(600), secs(120)), secs(30));
        assert_eq!(every(None, secs(2)), secs(1));
    }

    #[test]
    fn only_the_checks_own_connection_during_it_is_not_use() {
        let mut quiet = Quiet::new();
        quiet.look(Some((5, 0)));
        // The check's connection alone: quiet goes on.
        assert!(quiet.asked(Some(6)));
        assert_eq!(quiet.seen, 6);
        let since = quiet.since;
        quiet.look(Some((6, 0)));
        assert_eq!(quiet.since, since);
        // A call came and went during the next check: no pause on that
        // answer, and the quiet starts again.
        assert!(!quiet.asked(Some(8)));
        std::thread::sleep(Duration::from_millis(2));
        quiet.look(Some((8, 0)));
        assert!(quiet.since > since);
        // A connection open is use however the count stands.
        let since = quiet.since;
        std::thread::sleep(Duration::from_millis(2));
        quiet.look(Some((8, 1)));
        assert!(quiet.since > since);
        // No socket to count: only the agent's answer decides.
        assert!(quiet.asked(None));
    }

    #[test]
    fn a_guest_that_hibernates_pauses_first() {
        let secs = |s| Some(Duration::from_secs(s));
        let p = IdlePolicy::new(None, secs(120), secs(600));
        assert_eq!(
            (p.pause_after, p.hibernate_after_pause),
            (secs(120), secs(480))
        );
        // No pause of its own: it pauses as it hibernates.
        let p = IdlePolicy::new(None, None, secs(600));
        assert_eq!(
            (p.pause_after, p.hibernate_after_pause),
            (secs(600), secs(0))
        );
        // A hibernation sooner than the pause brings the pause forward.
        let p = IdlePolicy::new(None, secs(600), secs(60));
        assert_eq!(
            (p.pause_after, p.hibernate_after_pause),
            (secs(60), secs(0))
        );
        let p = IdlePolicy::new(secs(900), secs(120), None);
        assert_eq!(p.hibernate_after_pause, None);
    }
}
