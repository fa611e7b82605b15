//! Work in a running guest through its agent: commands (`exec`), code run
//! as a script (`code`),
//! background processes (`processes`), files and copies (`files`; copies
//! planned before they run, `copy_plan`; `host_write` for what lands on the
//! host) and metrics (`metrics`).

pub mod code;
pub mod copy_plan;
pub(crate) mod exec;
pub(crate) mod files;
pub mod host_write;
pub(crate) mod metrics;
pub(crate) mod processes;
