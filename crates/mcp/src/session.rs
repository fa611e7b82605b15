//! What belongs to one MCP session: its agent (`agent_register` or
//! `serve mcp --agent`), whose record goes when the session ends, and the
//! workspaces created with `session_scoped: true` (an agent's own among
//! them), deleted when the session ends (stdin closed, an
//! HTTP session closed or expired, the server shut down). A server killed
//! outright cannot delete them: their VMMs watch the server process and
//! stop with it, and a watcher process the first such workspace started
//! deletes them (the library's `delete_with_owner`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use workspace::agents::access::Caller;
use workspace::agents::AgentInfo;
use workspace::Workspaces;

/// One session's agent and workspaces.
#[derive(Debug)]
pub struct SessionScope {
    ws: Workspaces,
    /// Who the session's view of the workspaces acts for.
    caller: Arc<Caller>,
    /// What goes with the session, each with the agent it was made for
    /// (none: the session's own view's), which deletes it.
    names: Mutex<BTreeMap<String, Option<String>>>,
    agent: Mutex<Option<AgentInfo>>,
    /// An `agent_register` is making the agent's workspace.
    registering: AtomicBool,
}

/// Why a registration cannot begin.
#[derive(Debug)]
pub enum NotNow {
    /// The session has this agent already.
    Registered(Box<AgentInfo>),
    /// Another registration of the session is under way.
    Registering,
}

/// A registration under way; it ends when this goes.
#[derive(Debug)]
pub struct Registration<'a>(&'a SessionScope);

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.0.registering.store(false, Ordering::SeqCst);
    }
}

impl SessionScope {
    /// An empty scope over `ws`, which acts for `caller`.
    pub fn new(ws: Workspaces, caller: Arc<Caller>) -> Self {
        Self {
            ws,
            caller,
            names: Mutex::default(),
            agent: Mutex::default(),
            registering: AtomicBool::new(false),
        }
    }

    /// The session's agent, once registered.
    pub fn agent(&self) -> Option<AgentInfo> {
        lock(&self.agent).clone()
    }

    /// Begins the session's one registration: refused while another runs
    /// or once an agent is there, so two at once cannot both make a
    /// workspace.
    pub fn begin_registration(&self) -> Result<Registration<'_>, NotNow> {
        if let Some(agent) = self.agent() {
            return Err(NotNow::Registered(Box::new(agent)));
        }
        if self.registering.swap(true, Ordering::SeqCst) {
            return Err(NotNow::Registering);
        }
        let registration = Registration(self);
        // Set meanwhile by a registration that just ended.
        if let Some(agent) = self.agent() {
            return Err(NotNow::Registered(Box::new(agent)));
        }
        Ok(registration)
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
        self.adopt_for(name, None);
    }

    /// [`Self::adopt`] of a workspace made for agent `agent` before the
    /// session became it (an `agent_register` cut off mid-way): deleted
    /// as that agent's.
    pub fn adopt_for(&self, name: &str, agent: Option<&str>) {
        lock(&self.names).insert(name.to_owned(), agent.map(str::to_owned));
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
        for (name, made_for) in names {
            let view = match made_for {
                Some(agent) => {
                    let caller = Arc::new(Caller::new());
                    caller.set_agent(&agent);
                    self.ws.for_caller(caller)
                }
                None => self.ws.clone(),
            };
            let gone = view
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_registration_at_a_time_and_none_once_registered() {
        let dir = std::env::temp_dir().join(format!("mcp-registering-{}", std::process::id()));
        let ws = Workspaces::builder().state_dir(&dir).build().unwrap();
        let scope = SessionScope::new(ws.clone(), Arc::new(Caller::new()));
        let first = scope.begin_registration().unwrap();
        assert!(matches!(
            scope.begin_registration(),
            Err(NotNow::Registering)
        ));
        drop(first);
        let again = scope.begin_registration().unwrap();
        let info = ws.agents().register("alpha", Vec::new(), None).unwrap();
        scope.set_agent(info).unwrap();
        drop(again);
        assert!(matches!(
            scope.begin_registration(),
            Err(NotNow::Registered(_))
        ));
        scope.end();
        let _ = std::fs::remove_dir_all(dir);
    }
}
