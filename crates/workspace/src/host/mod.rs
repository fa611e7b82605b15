//! The host: where things are (`settings`, `assets`), what it lacks and
//! how to change it (`plan`, confirmed by `confirm`, `setup`, `kernel_build`, `kernel_install`),
//! its checks (`doctor`), its budget (`budget`), what a guest may write on
//! it (`host_write`), the confinement of VMM processes (`cgroup`, `jail`)
//! and the price table cost estimates use (`cost`).

pub mod assets;
pub mod budget;
pub mod cgroup;
pub mod confirm;
pub mod cost;
pub mod dirfd;
pub mod doctor;
pub mod host_write;
pub mod jail;
pub mod kernel_build;
pub mod kernel_install;
pub mod plan;
pub mod settings;
pub mod setup;
