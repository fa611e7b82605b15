//! Running programs in the guest: one command to its end (`exec`, over a
//! pipe or a terminal, `pty`), background processes with output rings
//! (`processes`, `ring`), and what both stand on: the spawn (`spawn`), the
//! reaper of exited children (`reaper`), the registry of running ones
//! (`registry`), the output poller (`poller`), program lookups (`lookup`)
//! and an exec's own root directory (`root`).

pub(crate) mod exec;
mod lookup;
mod poller;
pub(crate) mod processes;
mod pty;
pub(crate) mod reaper;
pub(crate) mod registry;
mod ring;
mod root;
mod spawn;
