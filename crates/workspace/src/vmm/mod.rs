//! The client side of a workspace's VMM process: how it is launched
//! (`launch`) and its control socket protocol (`control`).

pub(crate) mod control;
pub mod launch;
