//! `containerd-shim-microagent-v2`: containerd's runtime v2 shim for
//! microagent (runtime type `io.containerd.microagent.v2`). Every
//! container, or every pod sandbox, runs in a workspace microVM made by
//! the `workspace` library; docs/kubernetes.md says how to configure it.

mod checkpoint;
mod container;
mod error;
mod process;
mod record;
mod rootfs;
mod service;
mod shim;
mod spec;
mod stats;
mod stdio;

/// The runtime name containerd knows this shim by.
const RUNTIME_ID: &str = "io.containerd.microagent.v2";

#[tokio::main]
async fn main() {
    let config = containerd_shim::Config {
        // The workspace library waits for its own children (the VMM, the
        // tools it runs); a reaper of every child would take their exit
        // statuses first.
        no_reaper: true,
        // A VMM outlives a shim that dies (containerd's `delete` then
        // stops it): it must not stay this process's child.
        no_sub_reaper: true,
        ..containerd_shim::Config::default()
    };
    containerd_shim::asynchronous::run::<shim::MicroagentShim>(RUNTIME_ID, Some(config)).await;
    // Not the runtime's drop, which would wait for a thread still blocked
    // opening a FIFO no client opened.
    std::process::exit(0);
}
