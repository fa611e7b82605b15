//! The API: the collection of workspaces (`manager`) and how it is opened
//! (`builder`), one workspace's handle (`handle`), the runtime contract
//! (`contract`) and the one-shot use case (`one_shot`).

pub(crate) mod budget;
pub(crate) mod builder;
pub(crate) mod contract;
pub(crate) mod handle;
pub(crate) mod image_build;
pub(crate) mod kernel_install;
pub(crate) mod lifecycle;
pub(crate) mod manager;
pub(crate) mod one_shot;
pub(crate) mod ports;
