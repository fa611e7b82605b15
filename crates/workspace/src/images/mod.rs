//! Images: the registry of bootable images (`registry`), container images
//! converted to them (`oci`), pulled from registries (`pull`), found by name or description
//! (`search`), image builds (`build`), and container root filesystems
//! registered as they are (`root_dir`, for the containerd shim).

pub mod build;
pub mod kernels;
pub mod oci;
#[cfg(feature = "client")]
pub mod pull;
pub(crate) mod registry;
#[cfg(feature = "client")]
mod root_dir;
#[cfg(feature = "client")]
pub mod search;

pub use registry::*;
