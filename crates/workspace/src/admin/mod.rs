//! Operations on the host that orchestrate workspaces: image builds
//! (`image_build`) and kernel installs (`kernel_install`), each of which
//! boots a throwaway workspace; host setup (`host_setup`), the doctor's checks (`checks`), each
//! server's report and placement (`server_reports`), a create or command
//! on a remote server (`remote_ops`). Their records and plans live in
//! their concerns' folders (`host`, `network`, `images`); this folder sits
//! above them and the guest calls.

pub(crate) mod checks;
pub(crate) mod host_setup;
pub(crate) mod kernel_install;
pub(crate) mod remote_ops;
pub(crate) mod server_reports;
