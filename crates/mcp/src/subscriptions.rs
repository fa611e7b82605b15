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
use std::sync::Mutex;
use std::time::Duration;

use rmcp::model::ResourceUpdatedNotificationParam;
use rmcp::service::{Peer, SubscriptionSink};
use rmcp::RoleServer;
use tokio_util::sync::CancellationToken;
use workspace::Workspaces;

use crate::error::ToolError;

/// Subscriptions one session (or one `subscriptions/listen` request) may
/// hold at once; a guest keeps at most 16 watches, file_watch's among them.
pub const MAX_SUBSCRIPTIONS: usize = 8;

/// How long one read of a watch's events waits for a change before the
/// task looks whether its client is still there.
const LONG_POLL: Duration = Duration::from_secs(60);

/// Where a subscription's updates go.
#[derive(Clone)]
pub enum UpdateSink {
    /// `resources/subscribe` (before protocol 2026-07-28): notifications
    /// on the session.
    Session(Peer<RoleServer>),
    /// `subscriptions/listen` (2026-07-28): notifications on its
    /// request's stream, which its cancellation ends.
    Listen(SubscriptionSink),
}

impl std::fmt::Debug for UpdateSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            UpdateSink::Session(_) => "UpdateSink::Session",
            UpdateSink::Listen(_) => "UpdateSink::Listen",
        })
    }
}

impl UpdateSink {
    /// Tells the client that `uri` changed; false once it cannot be told.
    async fn updated(&self, uri: &str) -> bool {
        match self {
            UpdateSink::Session(peer) => peer
                .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                .await
                .is_ok(),
            UpdateSink::Listen(sink) => sink.notify_resource_updated(uri).await.is_ok(),
        }
    }

    /// The client is gone (nothing more can reach it).
    fn gone(&self) -> bool {
        match self {
            UpdateSink::Session(peer) => peer.is_transport_closed(),
            UpdateSink::Listen(_) => false,
        }
    }
}

/// A group of subscriptions by URI, ending together.
#[derive(Debug)]
pub struct Subscriptions {
    ws: Workspaces,
    /// Each URI's stop; a subscription that ended by itself has cancelled
    /// its own.
    live: Mutex<HashMap<String, CancellationToken>>,
    all: CancellationToken,
}

impl Subscriptions {
    /// None yet, over the caller's view `ws` (its owner checks apply).
    pub fn new(ws: Workspaces) -> Self {
        Self {
            ws,
            live: Mutex::default(),
            all: CancellationToken::new(),
        }
    }

    /// Subscriptions running now.
    pub fn count(&self) -> usize {
        lock(&self.live)
            .values()
            .filter(|t| !t.is_cancelled())
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
        if lock(&self.live).get(uri).is_some_and(|t| !t.is_cancelled()) {
            return Ok(());
        }
        self.room()?;
        let info = self
            .ws
            .workspace(name)?
            .watches()
            .watch_start(path, false)
            .await?;
        let stop = self.all.child_token();
        let taken = {
            let mut live = lock(&self.live);
            live.retain(|_, t| !t.is_cancelled());
            let taken = live.contains_key(uri) || live.len() >= MAX_SUBSCRIPTIONS;
            if !taken {
                live.insert(uri.to_owned(), stop.clone());
            }
            taken
        };
        let follow = Follow {
            ws: self.ws.clone(),
            name: name.to_owned(),
            watch: info.id,
            uri: uri.to_owned(),
        };
        if taken {
            // Another subscribe of the same URI, or the last free place,
            // won meanwhile: this one's watch goes.
            follow.stop_watch().await;
            return self.room();
        }
        tokio::spawn(follow.run(stop, sink));
        Ok(())
    }

    fn room(&self) -> Result<(), ToolError> {
        if self.count() >= MAX_SUBSCRIPTIONS {
            return Err(ToolError::Conflict(format!(
                "this session has {MAX_SUBSCRIPTIONS} resource subscriptions already; unsubscribe from one first"
            )));
        }
        Ok(())
    }

    /// Stops following `uri`; false when it was not followed.
    pub fn unsubscribe(&self, uri: &str) -> bool {
        match lock(&self.live).remove(uri) {
            Some(stop) => {
                let was_live = !stop.is_cancelled();
                stop.cancel();
                was_live
            }
            None => false,
        }
    }

    /// Stops every subscription of the group.
    pub fn end(&self) {
        self.all.cancel();
        lock(&self.live).clear();
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
    name: String,
    watch: String,
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
                _ = stop.cancelled() => break "unsubscribed".to_owned(),
                read = read => read,
            };
            match changes {
                Ok(changes) => {
                    since = changes.next;
                    if !changes.changes.is_empty() && !sink.updated(&self.uri).await {
                        break "the client cannot be told any more".to_owned();
                    }
                    if changes.watch.ended {
                        break "its path went away".to_owned();
                    }
                    if sink.gone() {
                        break "the client went away".to_owned();
                    }
                }
                Err(e) => break format!("reading its watch failed: {e}"),
            }
        };
        tracing::debug!(uri = %self.uri, %why, "a resource subscription ended");
        stop.cancel();
        self.stop_watch().await;
    }

    /// The guest keeps a watch until told; a workspace that stopped has
    /// none left to stop.
    async fn stop_watch(&self) {
        if let Ok(w) = self.ws.workspace(&self.name) {
            let _ = w.watches().watch_stop(&self.watch).await;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_group_counts_live_subscriptions_only_and_ends_them_all() {
        let dir = std::env::temp_dir().join(format!("mcp-subs-{}", std::process::id()));
        let ws = Workspaces::builder().state_dir(&dir).build().unwrap();
        let group = Subscriptions::new(ws);
        assert!(!group.unsubscribe("microagent://workspace/dev/files/x"));
        let stops: Vec<_> = (0..MAX_SUBSCRIPTIONS)
            .map(|i| {
                let stop = group.all.child_token();
                lock(&group.live).insert(format!("uri-{i}"), stop.clone());
                stop
            })
            .collect();
        assert!(matches!(group.room(), Err(ToolError::Conflict(_))));
        // One that ended by itself frees its place.
        stops[0].cancel();
        assert_eq!(group.count(), MAX_SUBSCRIPTIONS - 1);
        assert!(group.room().is_ok());
        assert!(!group.unsubscribe("uri-0"), "it had ended already");
        assert!(group.unsubscribe("uri-1"));
        assert!(stops[1].is_cancelled());
        group.end();
        assert!(stops.iter().all(CancellationToken::is_cancelled));
        assert_eq!(group.count(), 0);
        tokio::time::timeout(Duration::from_secs(5), group.ended())
            .await
            .unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }
}
