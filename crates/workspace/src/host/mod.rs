//! The host: where things are (`settings`, `assets`), what it lacks and
//! how to change it (`plan`, `setup`, `kernel_build`, `kernel_install`,
//! `kernels`), its checks (`doctor`), its budget (`budget`) and the price
//! table cost estimates use (`cost`).

pub mod assets;
pub mod budget;
pub mod cgroup;
pub mod cost;
pub mod doctor;
pub mod jail;
pub mod kernel_build;
pub mod kernel_install;
pub mod kernels;
pub mod plan;
pub mod settings;
#[cfg(feature = "client")]
pub mod setup;
