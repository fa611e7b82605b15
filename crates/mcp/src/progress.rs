//! Progress notifications for long calls (start, exec, run_code): sent about
//! once a second while the call runs, only when the client gave a progress
//! token, from the call's own task (so they stay tied to its request).

use std::future::Future;
use std::time::{Duration, Instant};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};

/// How often progress is reported.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Where a call's progress goes.
#[derive(Debug)]
pub struct Progress {
    target: Option<(Peer<RoleServer>, ProgressToken)>,
    started: Instant,
    last: f64,
}

impl Progress {
    /// Progress for the request of `ctx` (nothing is sent without a token).
    pub fn new(ctx: &RequestContext<RoleServer>) -> Self {
        Self {
            target: ctx
                .meta
                .get_progress_token()
                .map(|token| (ctx.peer.clone(), token)),
            started: Instant::now(),
            last: 0.0,
        }
    }

    /// Whether the client asked for progress.
    pub fn wanted(&self) -> bool {
        self.target.is_some()
    }

    /// Sends one notification: the seconds elapsed (always increasing) and
    /// `message`.
    pub async fn report(&mut self, message: String) {
        let Some((peer, token)) = &self.target else {
            return;
        };
        let elapsed = self.started.elapsed().as_secs_f64();
        // The spec wants progress to increase with every notification.
        let progress = if elapsed > self.last {
            elapsed
        } else {
            self.last + 0.001
        };
        self.last = progress;
        let param =
            ProgressNotificationParam::new(token.clone(), (progress * 1000.0).round() / 1000.0)
                .with_message(message);
        if let Err(e) = peer.notify_progress(param).await {
            tracing::debug!(%e, "progress notification not sent");
        }
    }

    /// Runs `work` to completion, reporting `status(elapsed)` every
    /// [`INTERVAL`] while it runs.
    pub async fn drive<T>(
        &mut self,
        work: impl Future<Output = T>,
        mut status: impl FnMut(Duration) -> String,
    ) -> T {
        tokio::pin!(work);
        if !self.wanted() {
            return work.await;
        }
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + INTERVAL, INTERVAL);
        loop {
            tokio::select! {
                done = &mut work => return done,
                _ = ticks.tick() => {
                    let message = status(self.started.elapsed());
                    self.report(message).await;
                }
            }
        }
    }
}

/// Runs `work`; over a transport that ends a session after `keep_alive`
/// without an event (rmcp's Streamable HTTP sessions), it pings the
/// client every fifth of it while `work` runs, so a long call, whether or
/// not its client asked for progress, keeps its session. A ping's answer
/// is not waited for by the call.
pub async fn keeping_session<T>(
    work: impl Future<Output = T>,
    peer: Peer<RoleServer>,
    keep_alive: Duration,
) -> T {
    tokio::pin!(work);
    let every = (keep_alive / 5).max(Duration::from_secs(1));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = ticks.tick() => {
                let peer = peer.clone();
                tokio::spawn(async move {
                    let ping = rmcp::model::ServerRequest::PingRequest(Default::default());
                    let answered = tokio::time::timeout(every, peer.send_request(ping)).await;
                    if let Ok(Err(e)) = answered {
                        tracing::debug!(%e, "a keep-alive ping was not answered");
                    }
                });
            }
        }
    }
}
