//! Agents: the identities MCP sessions register (`agent_register`, or
//! `serve mcp --agent NAME`), one file each in `<state>/agents/<id>.json`.
//! An agent lasts as long as its session: the session's end removes it,
//! and a listing prunes any whose server process has gone.

pub mod access;

use serde::{Deserialize, Serialize};

use base::code::ErrorCode;
use base::host::settings::{now_ms, unique_id};
use base::store::name::{validate_name, NameError};
use base::store::records::{RecordError, RecordLayout, RecordStore};
use base::store::spec::Owner;
use base::store::{StateDir, StoreError};

/// Where the records live in the state directory.
pub const AGENTS_DIR: &str = "agents";
/// Most capabilities an agent may declare.
pub const MAX_CAPABILITIES: usize = 32;
/// Longest capability, bytes.
pub const MAX_CAPABILITY_BYTES: usize = 64;

/// A registered agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct AgentInfo {
    /// Its id (`agent-<unique>`), made at registration.
    pub agent_id: String,
    /// The name it gave.
    pub name: String,
    /// What it says it can do (free-form words).
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// When it registered, ms since the Unix epoch.
    pub registered_at: u64,
    /// The workspace made for it, deleted with its session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The server process its session is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<Owner>,
}

/// Why an agent operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The name breaks the naming rules.
    #[error("invalid agent name `{name}`")]
    Name {
        /// The name given.
        name: String,
        /// Which rule.
        #[source]
        source: NameError,
    },
    /// Too many capabilities, or one too long or empty.
    #[error(
        "capabilities: at most {MAX_CAPABILITIES}, each 1-{MAX_CAPABILITY_BYTES} printable bytes"
    )]
    Capabilities,
    /// No agent has that id.
    #[error("no agent `{0}`")]
    NotFound(String),
    /// Reading or writing the state directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading, writing, listing or removing a record failed.
    #[error(transparent)]
    Record(RecordError),
}

impl From<RecordError> for AgentError {
    fn from(e: RecordError) -> Self {
        match e {
            // An id is made here, never typed: one that is no name is no agent.
            RecordError::Name { name } => AgentError::NotFound(name),
            e => AgentError::Record(e),
        }
    }
}

impl AgentError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Name { .. } | Self::Capabilities => ErrorCode::InvalidInput,
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::Store(e) => e.code(),
            Self::Record(e) => e.code(),
        }
    }
}

/// The agent records of a state directory.
#[derive(Clone, Debug)]
pub struct AgentStore {
    records: RecordStore<AgentInfo>,
}

impl AgentStore {
    /// The records of `state`.
    pub fn new(state: &StateDir) -> Self {
        Self {
            records: RecordStore::new(
                state.root().join(AGENTS_DIR),
                RecordLayout::File(".json"),
                |id| validate_name(id).is_ok(),
            ),
        }
    }

    #[cfg(test)]
    fn file(&self, id: &str) -> Result<std::path::PathBuf, AgentError> {
        Ok(self.records.files().file(id)?)
    }

    /// Checks a registration's name and capabilities.
    pub fn check(name: &str, capabilities: &[String]) -> Result<(), AgentError> {
        validate_name(name).map_err(|source| AgentError::Name {
            name: name.to_owned(),
            source,
        })?;
        let bad = |c: &String| {
            c.is_empty() || c.len() > MAX_CAPABILITY_BYTES || c.chars().any(char::is_control)
        };
        if capabilities.len() > MAX_CAPABILITIES || capabilities.iter().any(bad) {
            return Err(AgentError::Capabilities);
        }
        Ok(())
    }

    /// Records agent `name` of this process's session, with its workspace.
    pub fn register(
        &self,
        name: &str,
        capabilities: Vec<String>,
        workspace: Option<String>,
    ) -> Result<AgentInfo, AgentError> {
        Self::check(name, &capabilities)?;
        let info = AgentInfo {
            agent_id: format!("agent-{}", unique_id()),
            name: name.to_owned(),
            capabilities,
            registered_at: now_ms(),
            workspace,
            server: Owner::this_process(),
        };
        self.records.put(&info.agent_id, &info)?;
        Ok(info)
    }

    /// Agent `id`.
    pub fn get(&self, id: &str) -> Result<AgentInfo, AgentError> {
        self.records
            .get(id)?
            .ok_or_else(|| AgentError::NotFound(id.to_owned()))
    }

    /// Every agent whose server still runs, oldest first; the records of
    /// the others go.
    pub fn list(&self) -> Result<Vec<AgentInfo>, AgentError> {
        let ids = self.records.names()?;
        let mut out = Vec::new();
        for id in ids {
            let Ok(info) = self.get(&id) else {
                continue;
            };
            let alive = info
                .server
                .is_some_and(|s| base::store::process::is_alive(s.pid, s.start_ticks));
            if alive {
                out.push(info);
            } else {
                self.remove(&id)?;
            }
        }
        out.sort_by(|a, b| (a.registered_at, &a.agent_id).cmp(&(b.registered_at, &b.agent_id)));
        Ok(out)
    }

    /// Removes agent `id`'s record (gone already: nothing to do).
    pub fn remove(&self, id: &str) -> Result<(), AgentError> {
        self.records.remove(id)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base::store::write_json_atomic;

    #[test]
    fn agents_register_list_and_go() {
        let root = std::env::temp_dir().join(format!("ma-agents-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let store = AgentStore::new(&StateDir::at(&root).unwrap());
        assert!(store.list().unwrap().is_empty());
        let a = store
            .register("alpha", vec!["python".into()], Some("alpha-ws".into()))
            .unwrap();
        assert_eq!(store.get(&a.agent_id).unwrap(), a);
        assert_eq!(store.list().unwrap(), std::slice::from_ref(&a));
        // One whose server has gone is pruned by the listing.
        let mut ghost = a.clone();
        ghost.agent_id = "agent-ghost".into();
        ghost.server = Some(Owner {
            pid: u32::MAX - 1,
            start_ticks: 1,
        });
        write_json_atomic(&store.file("agent-ghost").unwrap(), &ghost).unwrap();
        assert_eq!(store.list().unwrap(), std::slice::from_ref(&a));
        assert!(matches!(
            store.get("agent-ghost"),
            Err(AgentError::NotFound(_))
        ));
        store.remove(&a.agent_id).unwrap();
        store.remove(&a.agent_id).unwrap();
        assert!(store.list().unwrap().is_empty());
        for (name, caps) in [("Bad Name", vec![]), ("ok", vec![String::new()])] {
            let e = store.register(name, caps, None).unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidInput, "{name}");
        }
        let _ = std::fs::remove_dir_all(root);
    }
}
