//! The host as a front end sees it: where assets are (`assets`), what it
//! lacks and how to change it (confirmed by `confirm`, `setup`; guest
//! kernels are `crate::kernels`), its checks (`doctor`), its budget
//! (`budget`), what a guest may write on it (`host_write`) and the price
//! table cost estimates use (`cost`). Settings, plans, the jail and cgroup
//! of VMM processes, the idle settings (`reclaim`, `idle`) and a release
//! bundle's assets (`bundle`) are in `base::host`,
//! re-exported here for front ends.

pub mod assets;
pub mod budget;
pub mod confirm;
pub mod cost;
pub mod doctor;
pub mod host_write;
pub mod setup;

pub use base::host::{bundle, cgroup, dirfd, idle, jail, kvm_group, plan, reclaim, settings};
