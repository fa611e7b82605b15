//! Images as a front end reaches them: pulled from registries (`pull`,
//! on `oci_pull`, the registry client's side), found by name or
//! description (`search`) and image builds (`build`). The registry of images and container image conversion are in
//! `base::images`, re-exported here for front ends.

pub mod build;
pub mod oci_pull;
pub mod pull;
pub mod search;

pub use base::images::*;
