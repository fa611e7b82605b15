//! The files of one workspace directory, and reading/writing its metadata
//! under the workspace lock.

use std::path::{Path, PathBuf};

use guest_agent::client::blocking::BlockingClient;

use crate::host::settings::now_ms;
use crate::store::console_log::tail_lines;
use crate::store::events::{EventKind, EventLog, EventsError};
use crate::store::spec::{LastExit, Meta};
use crate::store::state::{State, TransitionError};
use crate::store::{read_json, write_json_atomic, StateDir, StoreError, META_FILE};

/// The marker of a clone a start still has to make.
pub const REPO_PENDING: &str = "repo.pending";
/// A claimed pool member's new identity, which every connection to its
/// agent sends with its hello until the VMM ends (the agent takes it once).
pub const PENDING_IDENTITY: &str = "identity.pending";

/// Why a workspace's files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceDirError {
    /// It has no `meta.json`: no such workspace.
    #[error("workspace `{0}` does not exist")]
    NotFound(String),
    /// The state directory's path leaves no room for the socket names.
    #[error("the state directory path is too long for Unix sockets ({longest} > {MAX_SOCKET_PATH} bytes); set MICROAGENT_HOME to a shorter path")]
    SocketPathTooLong {
        /// The longest socket path it would need.
        longest: usize,
    },
    /// A file of the workspace could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The state directory.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An illegal state change.
    #[error("state change refused")]
    Transition(#[from] TransitionError),
    /// The event log.
    #[error("event log")]
    Events(#[from] EventsError),
}

type Result<T, E = WorkspaceDirError> = std::result::Result<T, E>;

/// The writable disk (ext4, sparse) the guest overlays on its image.
pub const DISK_FILE: &str = "disk.ext4";
/// The VMM's control socket (`vmm::control`'s protocol).
pub const CONTROL_SOCKET: &str = "control.sock";
/// The VMM's hybrid vsock socket.
pub const VSOCK_SOCKET: &str = "vsock.sock";
/// The VMM process's own log (its stderr).
pub const VMM_LOG: &str = "vmm.log";
/// The hibernated machine (memory and state; the disk stays where it is).
pub const HIBERNATION_DIR: &str = "hibernation";
/// The starter's ticket for the VMM process it is launching.
const LAUNCH_TICKET: &str = "launch.ticket";
/// The agent's vsock port.
pub const AGENT_PORT: u32 = 1024;
/// Console lines kept with a crash record.
pub const CRASH_TAIL_LINES: usize = 20;
/// Longest Unix socket path (sun_path is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// One workspace's directory.
#[derive(Clone, Debug)]
pub struct WorkspaceDir {
    name: String,
    dir: PathBuf,
}

impl WorkspaceDir {
    /// The directory of `name` in `state` (the name is validated).
    pub fn new(state: &StateDir, name: &str) -> Result<Self> {
        Ok(Self {
            name: name.to_owned(),
            dir: state.workspace_dir(name)?,
        })
    }

    /// The workspace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// `meta.json`.
    pub fn meta_path(&self) -> PathBuf {
        self.dir.join(META_FILE)
    }

    /// The writable disk.
    pub fn disk(&self) -> PathBuf {
        self.dir.join(DISK_FILE)
    }

    /// Its own copy of the volume in slot `slot` (a fork's, made from
    /// the snapshot it was forked from).
    pub fn volume_copy(&self, slot: usize) -> PathBuf {
        self.dir.join(format!("volume-{slot}.ext4"))
    }

    /// There while the repository a workspace was created from is still
    /// to be cloned in (at its first start).
    pub fn repo_pending(&self) -> PathBuf {
        self.dir.join(REPO_PENDING)
    }

    /// The empty file behind volume slots no volume fills.
    pub fn empty_slot(&self) -> PathBuf {
        self.dir.join("empty-slot.disk")
    }

    /// The hybrid vsock socket.
    pub fn vsock(&self) -> PathBuf {
        self.dir.join(VSOCK_SOCKET)
    }

    /// The directory of the relay sockets of this workspace's services
    /// (made by their VMMs: `crate::store::spec::services`).
    pub fn services_dir(&self) -> PathBuf {
        self.dir.join(crate::store::spec::services::SERVICES_DIR)
    }

    /// Where a service's VMM serves this workspace's guest the connections
    /// it makes to host vsock port `vsock_port`.
    pub fn service_relay(&self, vsock_port: u32) -> PathBuf {
        self.services_dir().join(format!("{vsock_port}.sock"))
    }

    /// The control socket.
    pub fn control(&self) -> PathBuf {
        self.dir.join(CONTROL_SOCKET)
    }

    /// Writes a new launch ticket (the starter, under the workspace's lock,
    /// before it spawns the VMM): a VMM process given the same ticket was
    /// started for this workspace by that starter, which is about to
    /// record it, so it may build its machine at once. Returns the ticket.
    pub fn issue_launch_ticket(&self) -> Result<String> {
        let ticket = crate::host::settings::unique_id();
        let path = self.dir.join(LAUNCH_TICKET);
        std::fs::write(&path, &ticket).map_err(|source| WorkspaceDirError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(ticket)
    }

    /// Whether `ticket` is the newest launch ticket.
    pub fn holds_launch_ticket(&self, ticket: &str) -> bool {
        std::fs::read_to_string(self.dir.join(LAUNCH_TICKET)).is_ok_and(|t| t == ticket)
    }

    /// Removes the launch ticket (once the VMM has checked its record).
    pub fn remove_launch_ticket(&self) {
        let _ = std::fs::remove_file(self.dir.join(LAUNCH_TICKET));
    }

    /// The event log.
    pub fn events(&self) -> EventLog {
        EventLog::new(&self.dir)
    }

    /// The identity the guest is still to take, if any.
    pub fn pending_identity(&self) -> Option<guest_agent::protocol::NewIdentity> {
        read_json(&self.dir.join(PENDING_IDENTITY)).ok()
    }

    /// Makes every later connection send `identity` until the VMM ends.
    pub fn set_pending_identity(
        &self,
        identity: &guest_agent::protocol::NewIdentity,
    ) -> Result<()> {
        Ok(write_json_atomic(
            &self.dir.join(PENDING_IDENTITY),
            identity,
        )?)
    }

    /// Forgets the pending identity (its VMM ended or is being replaced).
    pub fn clear_pending_identity(&self) {
        let _ = std::fs::remove_file(self.dir.join(PENDING_IDENTITY));
    }

    /// A blocking connection to its guest agent (for the VMM process, which
    /// runs no async runtime); reads and writes wait at most `timeout`.
    pub fn agent_blocking(
        &self,
        timeout: std::time::Duration,
    ) -> std::result::Result<BlockingClient, guest_agent::client::ClientError> {
        BlockingClient::connect_hybrid_vsock(&self.vsock(), AGENT_PORT, timeout)
    }

    /// Refuses a state directory whose socket paths would be too long.
    pub fn check_socket_paths(&self) -> Result<()> {
        let longest = self.vsock().as_os_str().len() + format!("_{AGENT_PORT}").len();
        if longest > MAX_SOCKET_PATH {
            return Err(WorkspaceDirError::SocketPathTooLong { longest });
        }
        Ok(())
    }

    /// Whether its services' relay sockets fit a Unix socket's path (a
    /// workspace with services: they are longer than the agent's).
    pub fn check_service_socket_paths(&self) -> Result<()> {
        use crate::store::spec::services::{relay_vsock_port, MAX_SERVICES, MAX_SERVICE_PORTS};
        let last = relay_vsock_port(MAX_SERVICES - 1, MAX_SERVICE_PORTS - 1);
        let longest = self.service_relay(last).as_os_str().len();
        if longest > MAX_SOCKET_PATH {
            return Err(WorkspaceDirError::SocketPathTooLong { longest });
        }
        Ok(())
    }

    /// Reads `meta.json`; a missing one means the workspace does not exist.
    pub fn read_meta(&self) -> Result<Meta> {
        match read_json(&self.meta_path()) {
            Ok(m) => Ok(m),
            Err(StoreError::Missing { .. }) => Err(WorkspaceDirError::NotFound(self.name.clone())),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `meta.json` atomically (hold the workspace lock).
    pub fn write_meta(&self, meta: &Meta) -> Result<()> {
        Ok(write_json_atomic(&self.meta_path(), meta)?)
    }

    /// Where its hibernated machine is kept (see [`HIBERNATION_DIR`]).
    pub fn hibernation(&self) -> PathBuf {
        self.dir.join(HIBERNATION_DIR)
    }

    /// Where a hibernation is written before it takes its name, and where
    /// the one it replaces goes meanwhile.
    pub fn hibernation_scratch(&self) -> [PathBuf; 2] {
        [".hibernation.tmp", ".hibernation.old"].map(|n| self.dir.join(n))
    }

    /// Removes every hibernated machine it has, whole or half written (a
    /// start that does not restore it; a stop). No VMM may run.
    pub fn remove_hibernation(&self) {
        for dir in std::iter::once(self.hibernation()).chain(self.hibernation_scratch()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// Records that it hibernated: `state` becomes Hibernated, the
    /// runtime gives way to `hibernation`, the event is logged and the
    /// sockets removed. Hold the workspace lock.
    pub fn record_hibernated(
        &self,
        meta: &mut Meta,
        hibernation: crate::store::spec::Hibernation,
        memory_bytes: u64,
        took_ms: u64,
    ) -> Result<()> {
        self.clear_pending_identity();
        meta.state = meta.state.become_(State::Hibernated)?;
        meta.runtime = None;
        let by = hibernation.by.clone();
        meta.hibernation = Some(hibernation);
        self.write_meta(meta)?;
        self.remove_sockets();
        // Recorded: the VMM ends now whatever happens to the event (a full
        // disk right after the memory file), so it is not an error.
        let _ = self.events().append(EventKind::Hibernated {
            by,
            memory_bytes,
            took_ms,
        });
        Ok(())
    }

    /// Records that its hibernated machine was discarded (a stop or a halt
    /// of a hibernated workspace): it becomes stopped, its disk as the
    /// guest left it, the hibernated time counted. Hold the workspace lock.
    pub fn record_hibernation_discarded(&self, meta: &mut Meta, reason: &str) -> Result<()> {
        meta.state = meta.state.become_(State::Stopped)?;
        let now = now_ms();
        meta.leave_hibernation(now);
        meta.last_exit = Some(LastExit {
            at_ms: now,
            reason: reason.to_owned(),
            console_tail: Vec::new(),
        });
        self.write_meta(meta)?;
        self.remove_hibernation();
        self.events().append(EventKind::Stopped)?;
        Ok(())
    }

    /// Removes the VMM's sockets (after it is gone).
    pub fn remove_sockets(&self) {
        let _ = std::fs::remove_file(self.control());
        let _ = std::fs::remove_file(self.vsock());
        // Guest-initiated vsock connections use `<vsock>_<port>` sockets.
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.filter_map(|e| e.ok()) {
                let name = e.file_name();
                if name
                    .to_string_lossy()
                    .starts_with(&format!("{VSOCK_SOCKET}_"))
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }

    /// Records that the run ended: `state` becomes Stopped or Crashed (via
    /// Stopping when needed), the runtime is cleared, the event logged and
    /// the sockets removed. Hold the workspace lock.
    pub fn record_exit(&self, meta: &mut Meta, crashed: bool, reason: &str) -> Result<()> {
        self.clear_pending_identity();
        let console_tail = if crashed {
            tail_lines(&self.dir, CRASH_TAIL_LINES).unwrap_or_default()
        } else {
            Vec::new()
        };
        if crashed {
            meta.state = meta.state.become_(State::Crashed)?;
        } else {
            if meta.state != State::Stopping {
                meta.state = meta.state.become_(State::Stopping)?;
            }
            meta.state = meta.state.become_(State::Stopped)?;
        }
        meta.runtime = None;
        meta.last_exit = Some(LastExit {
            at_ms: now_ms(),
            reason: reason.to_owned(),
            console_tail,
        });
        self.write_meta(meta)?;
        self.remove_sockets();
        // A run restored from a hibernation no longer needs it.
        self.remove_hibernation();
        self.events().append(if crashed {
            EventKind::Crashed {
                reason: reason.to_owned(),
            }
        } else {
            EventKind::Stopped
        })?;
        Ok(())
    }
}
