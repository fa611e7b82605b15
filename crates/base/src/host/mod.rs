//! The host as a VMM process and the library both see it: where things are
//! and the settings (`settings`), the confinement of VMM processes
//! (`cgroup`, `jail`), descriptors relative to a directory (`dirfd`), what
//! the host lacks and how to change it (`plan`) and the idle reclaim
//! setting (`reclaim`).

pub mod cgroup;
pub mod dirfd;
pub mod jail;
pub mod plan;
pub mod reclaim;
pub mod settings;
