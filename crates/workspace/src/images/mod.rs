//! Images: the registry of bootable images (`registry`), container images
//! converted to them (`oci`), and image builds (`build`).

pub mod build;
pub mod oci;
pub(crate) mod registry;

pub use registry::*;
