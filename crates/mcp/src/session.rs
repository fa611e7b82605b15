//! What belongs to one MCP session: its agent (`agent_register` or
//! `serve mcp --agent`), whose record goes when the session ends, and the
//! workspaces created with `session_scoped: true` (an agent's own among
//! them), deleted when the session ends (stdin closed, an
//! HTTP session closed or expired, the server shut down). A server killed
//! outright cannot delete them: their VMMs watch the server process and
//! stop with it, and a watcher process the first such workspace started
//! deletes them (the library's `delete_with_owner`).

use std::collections::BTreeSet;
use std::sync::Mutex;

use std::sync::Arc;

use workspace::agents::access::Caller;
use workspace::agents::AgentInfo;
use workspace::Workspaces;

/// One session's agent and workspaces.
#[derive(Debug)]
pub struct SessionScope {
    ws: Workspaces,
    /// Who the session's view of the workspaces acts for.
    caller: Arc<Caller>,
    names: Mutex<BTreeSet<String>>,
    agent: Mutex<Option<AgentInfo>>,
}

impl SessionScope {
    /// An empty scope over `ws`, which acts for `caller`.
    pub fn new(ws: Workspaces, caller: Arc<Caller>) -> Self {
        Self {
            ws,
            caller,
            names: Mutex::default(),
            agent: Mutex::default(),
        }
    }

    /// The session's agent, once registered.
    pub fn agent(&self) -> Option<AgentInfo> {
        lock(&self.agent).clone()
    }

    /// Records the session's agent; the one already there when it has one.
    pub fn set_agent(&self, info: AgentInfo) -> Result<(), Box<AgentInfo>> {
        let mut agent = lock(&self.agent);
        match &*agent {
            Some(existing) => Err(Box::new(existing.clone())),
            None => {
                // What the session makes from now on is the agent's.
                self.caller.set_agent(&info.name);
                *agent = Some(info);
                Ok(())
            }
        }
    }

    /// Workspace `name` goes when the session ends; should the server be
    /// killed first, a watcher deletes it.
    pub fn adopt(&self, name: &str) {
        lock(&self.names).insert(name.to_owned());
        if let Err(e) = self.ws.watch_this_process() {
            tracing::warn!(
                "{}; workspace {name} goes at the next listing if this server is killed",
                e.full_message()
            );
        }
    }

    /// Ends the session: its agent's record and its workspaces (running
    /// ones halted) go, once.
    pub fn end(&self) {
        if let Some(agent) = lock(&self.agent).take() {
            if let Err(e) = self.ws.agents().remove(&agent.agent_id) {
                tracing::warn!("removing agent {}: {e}", agent.agent_id);
            }
        }
        let names = std::mem::take(&mut *lock(&self.names));
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
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Drop for SessionScope {
    fn drop(&mut self) {
        self.end();
    }
}
