//! Resource subscriptions: a client subscribed to a guest file's resource
//! (`microagent://workspace/{name}/files/{path}`) is sent
//! `notifications/resources/updated` when the file changes (for a
//! directory: when an entry in it does). Each subscription is a guest
//! watch (the library's `Workspace::watches`, as `file_watch` uses) and a
//! task that long-polls its events; it ends when unsubscribed, when the
//! watch ends (the path went, the workspace stopped), when the client can
//! no longer be told, or with its session.
//!
//! While a subscription waits, its connection to the guest agent is open,
//! so the workspace does not pause on idle: a client that wants the
//! workspace to sleep unsubscribes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::ResourceUpdatedNotificationParam;
use rmcp::service::{Peer, SubscriptionSink};
use rmcp::RoleServer;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use workspace::{State, Workspaces};

use crate::error::ToolError;

/// Subscriptions one session (or one `subscriptions/listen` request) may
/// hold at once; a guest keeps at most 16 watches, file_watch's among them.
pub const MAX_SUBSCRIPTIONS: usize = 8;

/// How long one read of a watch's events waits for a change before the
/// task looks whether its client is still there.
const LONG_POLL: Duration = Duration::from_secs(60);

/// The shortest time between two updates of one subscription.
const NOTIFY_GAP: Duration = Duration::from_millis(250);

/// How long closing a group waits for its guest watches to be stopped.
const CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// The most URIs a `subscriptions/listen` may name: a longer list is
/// refused whole, before anything compares its entries.
pub const MAX_REQUESTED: usize = 64;

/// Where a subscription's updates go.
#[derive(Clone)]
pub enum UpdateSink {
    /// `resources/subscribe` (before protocol 2026-07-28): notifications
    /// on the session.
    Session(Peer<RoleServer>),
    /// `subscriptions/listen` (2026-07-28): notifications on its
    /// request's stream, which its cancellation ends.
    Listen(SubscriptionSink),
    /// Unit tests' sink: told nothing.
    #[cfg(test)]
    Nowhere,
}

impl std::fmt::Debug for UpdateSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UpdateSink::Session(_) => "UpdateSink::Session",
            UpdateSink::Listen(_) => "UpdateSink::Listen",
            #[cfg(test)]
            UpdateSink::Nowhere => "UpdateSink::Nowhere",
        })
    }
}

impl UpdateSink {
    /// Tells the client that `uri` changed; false once it cannot be told.
    pub(crate) async fn updated(&self, uri: &str) -> bool {
        match self {
            UpdateSink::Session(peer) => peer
                .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                .await
                .is_ok(),
            UpdateSink::Listen(sink) => sink.notify_resource_updated(uri).await.is_ok(),
            #[cfg(test)]
            UpdateSink::Nowhere => true,
        }
    }

    /// The client is gone (nothing more can reach it).
    fn gone(&self) -> bool {
        match self {
            UpdateSink::Session(peer) => peer.is_transport_closed(),
            UpdateSink::Listen(_) => false,
            #[cfg(test)]
            UpdateSink::Nowhere => false,
        }
    }
}

/// When the client last asked anything, and how long a silence ends its
/// subscriptions. Over HTTP a session with no request expires (rmcp's
/// keep-alive), but every message the server sends restarts that clock:
/// a client gone without closing its session would otherwise be kept, with
/// its subscriptions and guest watches, by the updates sent to nobody.
#[derive(Debug)]
pub struct Activity {
    started: std::time::Instant,
    /// Milliseconds from `started` to the last request.
    last_ms: AtomicU64,
    silence_limit: Option<Duration>,
}

impl Activity {
    fn new(silence_limit: Option<Duration>) -> Self {
        Self {
            started: std::time::Instant::now(),
            last_ms: AtomicU64::new(0),
            silence_limit,
        }
    }

    fn touch(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// The client has said nothing for longer than the limit.
    fn silent(&self) -> bool {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.silence_limit
            .is_some_and(|limit| self.started.elapsed().saturating_sub(last) > limit)
    }
}

/// A group of subscriptions by URI, ending together.
#[derive(Debug)]
pub struct Subscriptions {
    ws: Workspaces,
    activity: Arc<Activity>,
    /// Each URI's subscription, from before its guest watch is asked for
    /// (so a second subscribe or an unsubscribe meanwhile sees it); one
    /// that ended by itself has cancelled its own stop.
    live: Mutex<HashMap<String, Entry>>,
    all: CancellationToken,
    next_id: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Subscriptions {
    /// None yet, over the caller's view `ws` (its owner checks apply).
    pub fn new(ws: Workspaces) -> Self {
        Self::with_silence_limit(ws, None)
    }

    /// As [`Subscriptions::new`], ended one by one once the client has
    /// sent no request for `limit` (an HTTP session's keep-alive).
    pub fn with_silence_limit(ws: Workspaces, limit: Option<Duration>) -> Self {
        Self {
            ws,
            activity: Arc::new(Activity::new(limit)),
            live: Mutex::default(),
            all: CancellationToken::new(),
            next_id: AtomicU64::new(0),
        }
    }

    /// The client asked something (any request).
    pub fn touch(&self) {
        self.activity.touch();
    }

    /// Subscriptions running or being started now.
    pub fn count(&self) -> usize {
        lock(&self.live)
            .values()
            .filter(|e| !e.stop.is_cancelled())
            .count()
    }

    /// Follows `path` in workspace `name` as `uri`, telling `sink` at each
    /// change. Subscribing to a URI already followed changes nothing.
    /// Fails as `file_watch` does (unknown or stopped workspace, another
    /// agent's, a path that is not there), or past [`MAX_SUBSCRIPTIONS`].
    pub async fn subscribe(
        &self,
        uri: &str,
        name: &str,
        path: &str,
        sink: UpdateSink,
    ) -> Result<(), ToolError> {
        let (id, stop) = {
            let mut live = lock(&self.live);
            live.retain(|_, e| !e.stop.is_cancelled());
            if live.contains_key(uri) {
                return Ok(());
            }
            if live.len() >= MAX_SUBSCRIPTIONS {
                return Err(ToolError::Conflict(format!(
                    "this session has {MAX_SUBSCRIPTIONS} resource subscriptions already; unsubscribe from one first"
                )));
            }
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let stop = self.all.child_token();
            let entry = Entry {
                id,
                stop: stop.clone(),
                task: None,
            };
            live.insert(uri.to_owned(), entry);
            (id, stop)
        };
        let started = async {
            self.ws
                .workspace(name)?
                .watches()
                .watch_start(path, false)
                .await
        }
        .await;
        let info = match started {
            Ok(info) => info,
            Err(e) => {
                self.forget(uri, id);
                return Err(e.into());
            }
        };
        let follow = Follow {
            ws: self.ws.clone(),
            activity: self.activity.clone(),
            name: name.to_owned(),
            watch: info.id,
            path: info.path,
            uri: uri.to_owned(),
        };
        if stop.is_cancelled() {
            // Unsubscribed, or the group ended, while the guest started it.
            follow.stop_watch().await;
            return Ok(());
        }
        let task = tokio::spawn(follow.run(stop, sink));
        if let Some(entry) = lock(&self.live).get_mut(uri).filter(|e| e.id == id) {
            entry.task = Some(task);
        }
        Ok(())
    }

    /// Takes out `uri`'s entry if it is still the one numbered `id`.
    fn forget(&self, uri: &str, id: u64) {
        let mut live = lock(&self.live);
        if live.get(uri).is_some_and(|e| e.id == id) {
            live.remove(uri);
        }
    }

    /// Stops following `uri`; false when it was not followed.
    pub fn unsubscribe(&self, uri: &str) -> bool {
        match lock(&self.live).remove(uri) {
            Some(entry) => {
                let was_live = !entry.stop.is_cancelled();
                entry.stop.cancel();
                was_live
            }
            None => false,
        }
    }

    /// Stops every subscription and waits, at most [`CLOSE_WITHIN`], for
    /// their guest watches to be stopped (a server about to exit would
    /// leave them in the guest).
    pub async fn close(&self) {
        self.all.cancel();
        let tasks: Vec<JoinHandle<()>> = lock(&self.live)
            .drain()
            .filter_map(|(_, e)| e.task)
            .collect();
        let deadline = tokio::time::Instant::now() + CLOSE_WITHIN;
        for task in tasks {
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                tracing::debug!("a resource subscription did not stop its guest watch in time");
                return;
            }
        }
    }

    /// Ends when the group is ended.
    pub async fn ended(&self) {
        self.all.cancelled().await
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        self.all.cancel();
    }
}

/// One subscription's watch.
struct Follow {
    ws: Workspaces,
    activity: Arc<Activity>,
    name: String,
    /// The guest's id of the watch, and the path it follows (which tells
    /// it from a watch a restarted guest numbered the same).
    watch: String,
    path: String,
    uri: String,
}

impl Follow {
    /// Tells `sink` of each batch of changes until `stop`, then stops the
    /// guest's watch.
    async fn run(self, stop: CancellationToken, sink: UpdateSink) {
        let mut since = 0;
        let why = loop {
            let read = async {
                self.ws
                    .workspace(&self.name)?
                    .watches()
                    .watch_events(&self.watch, since, LONG_POLL)
                    .await
            };
            let changes = tokio::select! {
                biased;
                _ = stop.cancelled() => break "unsubscribed".to_owned(),
                read = read => read,
            };
            let changes = match changes {
                Ok(changes) if changes.watch.path == self.path => changes,
                Ok(_) => break "the guest restarted (its watch is another)".to_owned(),
                Err(e) => break format!("reading its watch failed: {e}"),
            };
            since = changes.next;
            if !changes.changes.is_empty() {
                let told = tokio::select! {
                    biased;
                    _ = stop.cancelled() => break "unsubscribed".to_owned(),
                    told = sink.updated(&self.uri) => told,
                };
                if !told {
                    break "the client cannot be told any more".to_owned();
                }
                // An update says only "read it again": a guest that writes
                // in a loop costs the host one a NOTIFY_GAP.
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break "unsubscribed".to_owned(),
                    _ = tokio::time::sleep(NOTIFY_GAP) => {}
                }
            }
            if changes.watch.ended {
                break "its path went away".to_owned();
            }
            if sink.gone() {
                break "the client went away".to_owned();
            }
            if self.activity.silent() {
                break "the client has been silent past its session's keep-alive".to_owned();
            }
        };
        tracing::debug!(uri = %self.uri, %why, "a resource subscription ended");
        stop.cancel();
        self.stop_watch().await;
    }

    /// Stops the guest's watch if it is still this one. A workspace that
    /// is not running is left be: a stopped one has no watches, and a
    /// hibernated one would be woken to take it out (its watch goes at
    /// its next start).
    async fn stop_watch(&self) {
        let running = self
            .ws
            .workspace(&self.name)
            .and_then(|w| w.inspect())
            .is_ok_and(|info| info.meta.state == State::Running);
        if !running {
            return;
        }
        let stopped = async {
            let watches = self
                .ws
                .workspace(&self.name)?
                .watches()
                .watch_list()
                .await?;
            if watches
                .iter()
                .any(|w| w.id == self.watch && w.path == self.path)
            {
                self.ws
                    .workspace(&self.name)?
                    .watches()
                    .watch_stop(&self.watch)
                    .await?;
            }
            Ok::<(), workspace::Error>(())
        };
        if let Err(e) = stopped.await {
            tracing::debug!(uri = %self.uri, "could not stop a subscription's guest watch: {e}");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_limited_group_ends_on_silence() {
        let limited = Activity::new(Some(Duration::from_millis(30)));
        let unlimited = Activity::new(None);
        assert!(!limited.silent());
        std::thread::sleep(Duration::from_millis(60));
        assert!(limited.silent());
        assert!(!unlimited.silent());
        limited.touch();
        assert!(!limited.silent());
    }

    #[tokio::test]
    async fn the_group_counts_live_subscriptions_only_and_ends_them_all() {
        let dir = std::env::temp_dir().join(format!("mcp-subs-{}", std::process::id()));
        let ws = Workspaces::builder().state_dir(&dir).build().unwrap();
        let group = Subscriptions::new(ws);
        assert!(!group.unsubscribe("microagent://workspace/dev/files/x"));
        let stops: Vec<_> = (0..MAX_SUBSCRIPTIONS as u64)
            .map(|id| {
                let stop = group.all.child_token();
                let entry = Entry {
                    id,
                    stop: stop.clone(),
                    task: Some(tokio::spawn(std::future::ready(()))),
                };
                lock(&group.live).insert(format!("uri-{id}"), entry);
                stop
            })
            .collect();
        let uri = "microagent://workspace/dev/files/x";
        let sink = || UpdateSink::Nowhere;
        let full = group.subscribe(uri, "dev", "/x", sink()).await;
        assert!(matches!(full, Err(ToolError::Conflict(_))), "{full:?}");
        // One that ended by itself frees its place; the workspace does
        // not exist, so this subscribe fails and holds nothing.
        stops[0].cancel();
        assert_eq!(group.count(), MAX_SUBSCRIPTIONS - 1);
        let absent = group.subscribe(uri, "dev", "/x", sink()).await;
        assert!(matches!(absent, Err(ToolError::Workspace(_))), "{absent:?}");
        assert_eq!(group.count(), MAX_SUBSCRIPTIONS - 1);
        assert!(!group.unsubscribe("uri-0"), "it had ended already");
        assert!(group.unsubscribe("uri-1"));
        assert!(stops[1].is_cancelled());
        group.close().await;
        assert!(stops.iter().all(CancellationToken::is_cancelled));
        assert_eq!(group.count(), 0);
        tokio::time::timeout(Duration::from_secs(5), group.ended())
            .await
            .unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
