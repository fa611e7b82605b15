//! Images: the registry of bootable images (`registry`), container images
//! converted to them (`oci`), pulled from registries (`pull`), and image
//! builds (`build`).

pub mod build;
pub mod kernels;
pub mod oci;
#[cfg(feature = "client")]
pub mod pull;
pub(crate) mod registry;

pub use registry::*;
