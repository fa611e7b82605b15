//! The snapshot calls the collection hands out (`ws.snapshots()`): get,
//! list, delete and restore snapshots by name (their code is in `ops`).
//! Taking one and forking from one are calls of the workspace's handle.

use crate::workspaces::manager::Workspaces;

/// The snapshots a collection of workspaces sees (`ws.snapshots()`).
/// `Copy`; its calls take it by value, so a restore's future borrows the
/// collection, not this value.
#[derive(Clone, Copy, Debug)]
pub struct Snapshots<'a> {
    pub(crate) all: &'a Workspaces,
}

impl Workspaces {
    /// The snapshots this view sees: by name, in its namespace (or by
    /// full name). Here rather than in `workspaces/`, which sits below
    /// this folder.
    pub fn snapshots(&self) -> Snapshots<'_> {
        Snapshots { all: self }
    }
}
