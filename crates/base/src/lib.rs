//! What a workspace's VMM process (crates/vmm-host) and the microagent
//! library (crates/workspace) share, and nothing above it: no async
//! runtime, registry client or MCP server, since every running workspace's
//! VMM process links this crate.
//!
//! The public modules are one concern each: [`store`] (the state directory
//! and its records), [`host`] (paths and settings, the jail and cgroup of a
//! VMM process, host plans, the idle reclaim setting), [`vmm`] (how a VMM
//! process is launched, its control protocol, its warm snapshot),
//! [`network`] (a workspace's network and how it is attached), [`images`]
//! (the image registry and container image conversion), [`volumes`] (named
//! volumes), [`host_tool`] (the one runner of host tools on outside data),
//! [`code`] (stable error codes), [`remedy`] (what a caller can do about a
//! failure), [`error_chain`] and [`pause_point`] (the kill -9 suite's
//! named pauses).

#![warn(missing_docs)]

pub mod code;
pub mod error_chain;
pub mod host;
pub mod host_tool;
pub mod images;
pub mod network;
pub mod pause_point;
pub mod remedy;
pub mod store;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;
pub mod vmm;
pub mod volumes;
