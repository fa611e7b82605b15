//! What belongs to one MCP session: the workspaces created with
//! `session_scoped: true`, deleted when the session ends (stdin closed, an
//! HTTP session closed or expired, the server shut down). A server killed
//! outright cannot delete them: their VMMs watch the server process and
//! stop with it, and the next listing deletes them (the library's
//! `delete_with_owner`).

use std::collections::BTreeSet;
use std::sync::Mutex;

use workspace::Workspaces;

/// One session's workspaces.
#[derive(Debug)]
pub struct SessionScope {
    ws: Workspaces,
    names: Mutex<BTreeSet<String>>,
}

impl SessionScope {
    /// An empty scope over `ws`.
    pub fn new(ws: Workspaces) -> Self {
        Self {
            ws,
            names: Mutex::default(),
        }
    }

    /// Workspace `name` goes when the session ends.
    pub fn adopt(&self, name: &str) {
        self.lock().insert(name.to_owned());
    }

    /// The session's workspaces.
    pub fn names(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    /// Ends the session: deletes its workspaces (running ones halted), once.
    pub fn end(&self) {
        let names = std::mem::take(&mut *self.lock());
        for name in names {
            let gone = self
                .ws
                .workspace(&name)
                .and_then(|w| w.delete(workspace::DeleteOptions::default().force(true)));
            match gone {
                Ok(_) => tracing::info!("deleted workspace {name}: its MCP session ended"),
                // Deleted already, by the client or by hand.
                Err(e) if e.code() == workspace::ErrorCode::NotFound => {}
                Err(e) => tracing::warn!(
                    "deleting workspace {name} at the end of its session: {}",
                    e.full_message()
                ),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.names
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for SessionScope {
    fn drop(&mut self) {
        self.end();
    }
}
