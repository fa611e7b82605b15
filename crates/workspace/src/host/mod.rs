//! The host: where things are (`settings`, `assets`), what it lacks and
//! how to change it (`plan`, `setup`, `kernel_build`, `kernel_install`,
//! `kernels`), its checks (`doctor`) and its budget (`budget`).

pub mod assets;
pub mod budget;
pub mod doctor;
pub mod kernel_build;
pub mod kernel_install;
pub mod kernels;
pub mod plan;
pub mod settings;
pub mod setup;
