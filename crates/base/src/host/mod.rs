//! The host as a VMM process and the library both see it: where things are
//! and the settings (`settings`), a release bundle's assets (`bundle`), the confinement of VMM processes
//! (`cgroup`, `jail`), who may use /dev/kvm (`kvm_group`), descriptors relative to a directory (`dirfd`), what
//! the host lacks and how to change it (`plan`), the idle reclaim
//! setting (`reclaim`) and the idle pause setting (`idle`).

pub mod bundle;
pub mod cgroup;
pub mod dirfd;
pub mod idle;
pub mod jail;
pub mod kvm_group;
pub mod plan;
pub mod reclaim;
pub mod settings;
