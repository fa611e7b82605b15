//! Images as a front end reaches them, one folder: the service
//! `ws.images()` (`service`: who uses an image, deleting one, search and
//! build), pulled from registries (`pull`, on `oci_pull`, the registry
//! client's side), found by name or description (`search`) and image
//! builds, their plans, recipes and run (`build`). The registry of images and container image conversion are in
//! `base::images`, re-exported here for front ends.

pub mod build;
pub mod oci_pull;
pub mod pull;
pub mod search;
pub mod service;

pub use base::images::*;
