//! The network calls a front end makes (`service`: `ws.networks()`) and
//! the host setup they need (`setup`: bridges, `dnsmasq`, nftables;
//! `passt_build`: a fixed `passt` for older hosts). A network's records,
//! its addresses and how a VMM process attaches to it are in
//! `base::network`, re-exported here for front ends.

pub mod passt_build;
pub mod service;
pub mod setup;

pub use base::network::*;
pub use service::{NetworkUsers, Networks};
