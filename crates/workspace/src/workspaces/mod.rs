//! The collection of workspaces (`manager`) and how it is opened
//! (`builder`), its creates and lists (`collection`), their life cycle with hibernation (`lifecycle`), the host budget a start
//! checks (`budget`), published ports (`ports`), volume mounts as the collection applies them (`mounts`), the services' handles
//! and accessors (`services`), the runtime contract
//! (`contract`) and the one-shot use case (`one_shot`).

pub(crate) mod budget;
pub(crate) mod builder;
pub(crate) mod collection;
pub(crate) mod contract;
pub(crate) mod detached;
pub(crate) mod egress;
pub(crate) mod handle;
pub(crate) mod lifecycle;
pub(crate) mod manager;
pub(crate) mod mounts;
pub(crate) mod one_shot;
pub(crate) mod placement;
pub(crate) mod ports;
pub(crate) mod services;
pub(crate) mod tenancy;
