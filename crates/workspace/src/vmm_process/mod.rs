//! What runs inside a workspace's VMM process: the process itself
//! (`host`), its confinement (`guard`, `jail`, `cgroup`) and its published
//! ports (`port_forward`).

pub mod cgroup;
pub mod guard;
pub mod host;
pub(crate) mod jail;
pub(crate) mod port_forward;
