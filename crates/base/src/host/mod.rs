//! The host as a VMM process and the library both see it: where things are
//! and the settings (`settings`), the confinement of VMM processes
//! (`cgroup`, `jail`), descriptors relative to a directory (`dirfd`), what
//! the host lacks and how to change it (`plan`), the idle reclaim
//! setting (`reclaim`) and the idle pause setting (`idle`).

pub mod cgroup;
pub mod dirfd;
pub mod idle;
pub mod jail;
pub mod plan;
pub mod reclaim;
pub mod settings;
