//! Images: the registry of bootable images (`registry`), the kernels
//! they boot (`kernels`), container images converted to them (`oci`),
//! and container root filesystems registered as they are (`root_dir`,
//! for the containerd shim).

pub mod kernels;
pub mod oci;
pub mod registry;
mod root_dir;

pub use registry::*;
