//! Images: the registry of bootable images (`registry`), container images
//! converted to them (`oci`), pulled from registries (`pull`), found by name or description
//! (`search`), and image builds (`build`).

pub mod build;
pub mod kernels;
pub mod oci;
#[cfg(feature = "client")]
pub mod pull;
pub(crate) mod registry;
#[cfg(feature = "client")]
pub mod search;

pub use registry::*;
