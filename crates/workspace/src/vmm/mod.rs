//! The client side of a workspace's VMM process (crates/vmm-host): how it
//! is launched (`launch`), its control socket protocol (`control`), the
//! warm snapshot it is asked to keep (`warm`) and what its confinement
//! leaves behind (`confinement`).

pub mod confinement;
pub mod control;
pub mod launch;
pub mod warm;

pub use control::ControlError;
