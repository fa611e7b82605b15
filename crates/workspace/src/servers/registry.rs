//! The servers this host knows (`<state>/servers/<name>.json`, one file
//! each, so two adds never lose one) and where each remote workspace lives
//! (`<state>/servers/placed/<workspace>.json`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::spec::{check_server_name, ServerSpec, LOCAL_SERVER};
use super::ServerError;
use base::store::name::validate_full_name;
use base::store::records::{RecordLayout, RecordStore};
use base::store::StateDir;

/// The servers folder of the state directory.
const SERVERS_DIR: &str = "servers";
/// Its folder of placements.
const PLACED_DIR: &str = "placed";
/// Where a workspace placed on a remote server lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct PlacedWorkspace {
    /// The workspace (its name here and there).
    pub workspace: String,
    /// The server it lives on.
    pub server: String,
    /// The agent whose session created it (none: the host, a session
    /// without an agent, or a placement older than owners). The remote
    /// knows no agents: every forwarded operation is checked against this
    /// before any ssh runs (`Workspaces::placement_of`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// The servers of a state directory and their placements.
#[derive(Clone, Debug)]
pub struct ServerRegistry {
    servers: RecordStore<ServerSpec>,
    placed: RecordStore<PlacedWorkspace>,
}

impl ServerRegistry {
    /// The servers of `state`.
    pub fn new(state: &StateDir) -> Self {
        let root = state.root().join(SERVERS_DIR);
        Self {
            placed: RecordStore::new(
                root.join(PLACED_DIR),
                RecordLayout::File(".json"),
                |workspace| validate_full_name(workspace).is_ok(),
            ),
            servers: RecordStore::new(root, RecordLayout::File(".json"), |name| {
                check_server_name(name).is_ok()
            }),
        }
    }

    /// Where ssh keeps this state directory's shared connections.
    pub fn control_dir(&self) -> PathBuf {
        self.servers.dir().join("ssh")
    }

    /// `ssh` to `spec` running the shell line `remote` over this state
    /// directory's shared connection to it; `tty` asks for a terminal.
    pub fn ssh_command(
        &self,
        spec: &ServerSpec,
        remote: &str,
        tty: bool,
    ) -> Result<std::process::Command, ServerError> {
        base::store::make_private_dir(&self.control_dir())?;
        Ok(super::ssh::command(spec, &self.control_dir(), remote, tty))
    }

    /// Adds `spec`; CONFLICT when the name is taken.
    pub fn add(&self, spec: &ServerSpec) -> Result<(), ServerError> {
        spec.check()?;
        if !self.servers.create(&spec.name, spec)? {
            return Err(ServerError::Exists(spec.name.clone()));
        }
        Ok(())
    }

    /// Server `name`.
    pub fn get(&self, name: &str) -> Result<ServerSpec, ServerError> {
        // This host is no record: asking for it finds none.
        if name != LOCAL_SERVER {
            check_server_name(name)?;
            if let Some(spec) = self.servers.get(name)? {
                return Ok(spec);
            }
        }
        Err(ServerError::NotFound(name.to_owned()))
    }

    /// Every server, by name.
    pub fn list(&self) -> Result<Vec<ServerSpec>, ServerError> {
        let mut specs = Vec::new();
        for name in self.servers.names()? {
            specs.push(self.get(&name)?);
        }
        Ok(specs)
    }

    /// Removes server `name`; CONFLICT while workspaces are placed on it.
    pub fn remove(&self, name: &str) -> Result<ServerSpec, ServerError> {
        let spec = self.get(name)?;
        let placed: Vec<String> = self
            .placements()?
            .into_iter()
            .filter(|p| p.server == name)
            .map(|p| p.workspace)
            .collect();
        if !placed.is_empty() {
            return Err(ServerError::InUse {
                server: name.to_owned(),
                workspaces: placed,
            });
        }
        self.servers.remove(name)?;
        Ok(spec)
    }

    /// Records that `workspace` lives on `server`, created by `agent`'s
    /// session (none: nobody's); the record written.
    pub fn place(
        &self,
        workspace: &str,
        server: &str,
        agent: Option<&str>,
    ) -> Result<PlacedWorkspace, ServerError> {
        validate_full_name(workspace).map_err(|e| ServerError::Invalid(e.to_string()))?;
        let placement = PlacedWorkspace {
            workspace: workspace.to_owned(),
            server: server.to_owned(),
            agent: agent.map(str::to_owned),
        };
        // Added only when free: of two creates of one name that both
        // passed the check before their ssh, the second is refused here
        // rather than taking the first one's record.
        if !self.placed.create(workspace, &placement)? {
            return Err(ServerError::PlacedAlready {
                workspace: workspace.to_owned(),
                server: server.to_owned(),
            });
        }
        Ok(placement)
    }

    /// Where `workspace` lives, when on a remote server.
    pub fn placement(&self, workspace: &str) -> Result<Option<PlacedWorkspace>, ServerError> {
        if validate_full_name(workspace).is_err() {
            return Ok(None);
        }
        Ok(self.placed.get(workspace)?)
    }

    /// Forgets where `workspace` lived (it was deleted there). A name no
    /// workspace can have was never placed.
    pub fn unplace(&self, workspace: &str) -> Result<(), ServerError> {
        if validate_full_name(workspace).is_ok() {
            self.placed.remove(workspace)?;
        }
        Ok(())
    }

    /// Every placement.
    pub fn placements(&self) -> Result<Vec<PlacedWorkspace>, ServerError> {
        let mut all = Vec::new();
        for workspace in self.placed.names()? {
            all.extend(self.placement(&workspace)?);
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_added_once_listed_and_removed_when_empty() {
        let dir = std::env::temp_dir().join(format!("ma-servers-{}", std::process::id()));
        let state = StateDir::at(dir.join("state")).unwrap();
        let servers = ServerRegistry::new(&state);
        assert!(servers.list().unwrap().is_empty());
        let spec = ServerSpec::new("box-1", "ci@127.0.0.1:2222").state_dir("/srv/ma");
        servers.add(&spec).unwrap();
        assert!(matches!(servers.add(&spec), Err(ServerError::Exists(_))));
        assert_eq!(servers.get("box-1").unwrap(), spec);
        assert_eq!(servers.list().unwrap(), vec![spec.clone()]);
        for bad in [
            ServerSpec::new("local", "h"),
            ServerSpec::new("Box", "h"),
            ServerSpec::new("b", "u@h:99999"),
            ServerSpec::new("b", "h").ssh_option("ProxyCommand"),
            ServerSpec::new("b", "h").state_dir(""),
        ] {
            assert_eq!(
                servers.add(&bad).unwrap_err().code(),
                base::code::ErrorCode::InvalidInput,
                "{bad:?}"
            );
        }
        servers.place("dev", "box-1", Some("alice")).unwrap();
        let again = servers.place("dev", "box-1", Some("bob")).unwrap_err();
        assert!(
            matches!(again, ServerError::PlacedAlready { .. }),
            "{again}"
        );
        assert_eq!(again.code(), base::code::ErrorCode::Conflict);
        let placed = servers.placement("dev").unwrap().unwrap();
        assert_eq!(placed.server, "box-1");
        assert_eq!(placed.agent.as_deref(), Some("alice"));
        assert!(servers.placement("other").unwrap().is_none());
        assert!(matches!(
            servers.remove("box-1"),
            Err(ServerError::InUse { .. })
        ));
        servers.unplace("dev").unwrap();
        servers.remove("box-1").unwrap();
        assert!(matches!(
            servers.get("box-1"),
            Err(ServerError::NotFound(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
