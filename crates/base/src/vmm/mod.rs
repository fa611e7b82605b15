//! The client side of a workspace's VMM process (crates/vmm-host): how it
//! is launched (`launch`), its control socket protocol (`control`), the
//! warm snapshot it is asked to keep (`warm`), how a snapshot directory it
//! wrote is made durable and checked (`seal`), what its confinement
//! leaves behind (`confinement`), the standby processes made before
//! their workspace is known (`standby`), how a descriptor reaches it beside a
//! control request (`fd_pass`), how its process is made (`spawn`) and the
//! account it runs as (`user`).

pub mod confinement;
pub mod control;
pub(crate) mod fd_pass;
pub mod launch;
pub mod seal;
pub mod spawn;
pub mod standby;
pub mod user;
pub mod warm;

pub use control::ControlError;
