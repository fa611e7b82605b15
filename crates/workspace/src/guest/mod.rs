//! Work in a running guest through its agent: commands (`exec`), code run
//! as a script (`code`),
//! background processes (`processes`), files and copies (`files`; copies
//! planned before they run, `copy_plan`; `host_write` for what lands on the
//! host) and metrics (`metrics`).

#[cfg(feature = "client")]
pub mod code;
#[cfg(feature = "client")]
pub mod copy_plan;
#[cfg(feature = "client")]
pub(crate) mod exec;
#[cfg(feature = "client")]
pub(crate) mod files;
pub mod host_write;
#[cfg(feature = "client")]
pub(crate) mod metrics;
#[cfg(feature = "client")]
pub(crate) mod processes;
