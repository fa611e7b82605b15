//! The tools, one module per family, each its own tool router that
//! [`crate::MicroagentServer::new`] adds up: [`lifecycle`] (create, start,
//! stop, halt, delete, list, inspect, logs, events), [`run`] (a command in
//! a one-shot workspace), [`exec`] (exec, run_code), [`processes`]
//! (background processes), [`files`] (read, write, list, copy in and out),
//! [`file_ops`] (stat, mkdir, remove, move, edit, find), [`info`] (images,
//! doctor, contract, cost), [`images`] (inspect, import, pull, search,
//! delete), [`snapshots`] (take, list, get, delete, restore, fork),
//! [`volumes`] (create, list, inspect, delete), [`networks`] (network
//! objects, host networking setup), [`ports`] (publish, list, unpublish),
//! [`host`] (kernel install and image build, preview then confirm;
//! servers), [`agents`] (register, list, the session's workspace),
//! [`watch`] (file watches), [`browser`] (a headless Chromium in the
//! workspace), [`code`] (code sessions: Jupyter kernels) and [`repos`]
//! (allowed repositories, pulls and diffs; tasks). Every tool calls the
//! workspace library; this module holds what they share: argument checks,
//! and running the library's blocking calls off the async runtime.

pub mod agents;
pub mod browser;
pub mod code;
pub mod exec;
pub mod file_ops;
pub mod files;
pub mod host;
pub mod images;
pub mod info;
pub mod lifecycle;
pub mod networks;
pub mod ports;
pub mod processes;
pub mod repos;
pub mod run;
pub mod snapshots;
pub mod volumes;
pub mod watch;

use std::time::Duration;

use workspace::Workspaces;
use workspace::LIMITS;

use crate::error::blocking;
use crate::{MicroagentServer, ToolError};

impl MicroagentServer {
    /// Runs a synchronous library call on the blocking pool: creating a
    /// disk, halting a VMM and deleting take seconds (see "Blocking" in
    /// [`Workspaces`]).
    pub(crate) async fn blocking<T, F>(&self, call: F) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce(&Workspaces) -> Result<T, ToolError> + Send + 'static,
    {
        let ws = self.ws.clone();
        blocking(move || call(&ws)).await
    }

    /// [`Self::blocking`] for a library call about workspace `name`.
    pub(crate) async fn on_workspace<T, F>(&self, name: &str, call: F) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce(&Workspaces, &str) -> workspace::Result<T> + Send + 'static,
    {
        let name = name.to_owned();
        self.blocking(move |ws| Ok(call(ws, &name)?)).await
    }
}

/// `ws` seen from `namespace` when a call names one (else the session's).
pub(crate) fn seen_from(ws: &Workspaces, namespace: Option<&str>) -> workspace::Result<Workspaces> {
    match namespace {
        Some(namespace) => ws.in_namespace(namespace),
        None => Ok(ws.clone()),
    }
}

/// The `action` of a preview (`would ...`) or of what was done (`did ...`).
pub(crate) fn would_or_did(preview: bool, action: &str) -> String {
    format!("{} {action}", if preview { "would" } else { "did" })
}

/// `value` (named `what`, in `unit`) checked to lie in `min..=max`.
pub(crate) fn in_range(what: &str, value: u64, min: u64, max: u64) -> Result<u64, ToolError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ToolError::InvalidInput(format!(
            "{what} is {value}; use {min} to {max}"
        )))
    }
}

/// Seconds given as `what`, defaulting to `default`, within `1..=max`.
pub(crate) fn seconds(
    what: &str,
    value: Option<u64>,
    default: u64,
    max: u64,
) -> Result<Duration, ToolError> {
    Ok(Duration::from_secs(in_range(
        what,
        value.unwrap_or(default),
        1,
        max,
    )?))
}

/// A vCPU count (the library checks the upper limit, this the type's).
pub(crate) fn vcpus(value: Option<u32>, default: u8) -> Result<u8, ToolError> {
    match value {
        None => Ok(default),
        Some(v) => u8::try_from(v).map_err(|_| {
            ToolError::InvalidInput(format!("vcpus is {v}; use 1 to {}", LIMITS.max_vcpus))
        }),
    }
}

/// Checks that a guest path is absolute (as the agent requires).
pub(crate) fn guest_path(what: &str, path: &str) -> Result<(), ToolError> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(ToolError::InvalidInput(format!(
            "{what} {path:?} is not absolute; guest paths start with /"
        )))
    }
}

/// Whether the client is in a session (it initialized with a version that
/// has one): stateless requests have no end to scope anything to.
pub(crate) fn has_session(ctx: &rmcp::service::RequestContext<rmcp::RoleServer>) -> bool {
    ctx.peer
        .peer_info()
        .is_some_and(|info| info.protocol_version.has_initialize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_say_what_is_allowed() {
        assert_eq!(in_range("x", 3, 1, 5).unwrap(), 3);
        let err = in_range("lines", 0, 1, 5000).unwrap_err();
        assert_eq!(err.to_string(), "lines is 0; use 1 to 5000");
        assert_eq!(
            seconds("t", None, 30, 600).unwrap(),
            Duration::from_secs(30)
        );
        assert!(seconds("t", Some(601), 30, 600).is_err());
        assert_eq!(vcpus(Some(2), 1).unwrap(), 2);
        assert!(vcpus(Some(300), 1).is_err());
        assert!(guest_path("path", "etc").is_err());
    }
}
