//! Named volumes as a front end reaches them, one folder: the service
//! `ws.volumes()` (`service`: volumes with their holders, create, delete,
//! export). The volume store, the mounts a spec names and the rule a
//! start checks are in `base::volumes`, re-exported here for front ends;
//! the collection applies that rule at a start and a restore.

pub mod service;

pub use base::volumes::*;
