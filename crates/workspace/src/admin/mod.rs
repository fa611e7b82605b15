//! Operations on the host that span its concerns: host setup
//! (`host_setup`: packages, networking, the kernel, the images), the
//! doctor's checks (`checks`), each server's report and placement
//! (`server_reports`), a create or command on a remote server
//! (`remote_ops`). What they drive lives in its concern's folder
//! (`host`, `network`, `images`, `kernels`); this folder sits above them.

pub(crate) mod checks;
pub(crate) mod host_setup;
pub(crate) mod remote_ops;
pub(crate) mod server_reports;
