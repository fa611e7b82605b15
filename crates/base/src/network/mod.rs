//! A workspace's network: `user` (the default: rootless NAT through a
//! `passt` process of its own, which the VMM starts and connects to) or
//! `none` (no network device; published ports still work over vsock).
//!
//! On the `user` network every guest has the same addresses, as each has
//! its own `passt`: [`USER_GUEST_ADDR`] on [`USER_PREFIX`], the gateway
//! [`USER_GATEWAY`], which `passt` maps to the host's loopback (so host
//! services are reachable as [`HOST_ALIAS`]), and the resolver
//! [`USER_DNS`], which `passt` forwards to the host's resolver. The guest's
//! init takes them from the kernel command line (`microagent_net=`).

use std::net::Ipv4Addr;

pub mod attach;
pub mod nft;
pub mod objects;
mod passt;
pub mod user_filter;

pub use crate::store::egress::{AllowEntry, Egress};
pub use crate::store::subnet::Subnet;
pub use objects::{
    Addressing, Backend, GuestNetwork, Network, NetworkError, NetworkInfo, NetworkRequest,
    NetworkStore, NetworksLock,
};
pub use passt::{
    passt_binary, passt_snapshot, passt_snapshot_date, start_passt, Passt, PasstAhead,
    PasstSetting, PASST_FIXED_SNAPSHOT, PASST_OVERRIDE_VAR,
};

/// The name guests reach the host's loopback by, where the network allows.
pub const HOST_ALIAS: &str = "host.microagent.internal";
/// The guest's address on the `user` network.
pub const USER_GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// The `user` network's prefix length.
pub const USER_PREFIX: u8 = 24;
/// The `user` network's gateway: the host's loopback as the guest sees it.
pub const USER_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// The `user` network's resolver (forwarded to the host's).
pub const USER_DNS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// `passt`'s log in the workspace directory.
pub const PASST_LOG: &str = "passt.log";

/// Checks the form of a network name a workspace asks for (whether it
/// exists is checked against [`NetworkStore`] at create).
pub fn validate_network(name: &str) -> Result<(), NetworkError> {
    crate::store::name::validate_network_name(name)
        .map_err(|e| NetworkError::Invalid(format!("network name `{name}`: {e}")))
}

/// The guest's addresses as `microagent_net=` and a restored guest's
/// agent take them: `ADDR/PREFIX,GATEWAY,DNS`.
pub fn net_setting(a: &Addressing) -> String {
    format!("{}/{},{},{}", a.guest, a.prefix, a.gateway, a.dns)
}

/// The guest's addresses on a network: what init reads from
/// `microagent_net=`; `None` for no network.
pub fn guest_cmdline(addr: Option<&Addressing>) -> Option<String> {
    addr.map(|a| {
        format!(
            "microagent_net={} microagent_host_alias={HOST_ALIAS}",
            net_setting(a)
        )
    })
}

/// A workspace's MAC address: locally administered, derived from its name
/// (stable across its starts; forks keep their snapshot's).
pub fn mac_for(workspace: &str) -> [u8; 6] {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(workspace.as_bytes());
    [0x02, 0x4d, digest[0], digest[1], digest[2], digest[3]]
}

#[cfg(test)]
mod user_filter_hostile_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::name::{NO_NETWORK, USER_NETWORK};

    #[test]
    fn network_names_are_checked_for_form() {
        validate_network(USER_NETWORK).unwrap();
        validate_network(NO_NETWORK).unwrap();
        validate_network("corp").unwrap();
        let err = validate_network("Corp Net").unwrap_err();
        assert!(err.to_string().contains("network name"), "{err}");
    }

    #[test]
    fn the_user_network_tells_init_its_addresses() {
        let user = Network::user().addressing(0);
        assert_eq!(
            guest_cmdline(user.as_ref()).unwrap(),
            "microagent_net=10.0.2.15/24,10.0.2.2,10.0.2.3 microagent_host_alias=host.microagent.internal"
        );
        assert_eq!(guest_cmdline(None), None);
        assert_eq!(user.unwrap().guest, USER_GUEST_ADDR);
        assert_eq!(user.unwrap().gateway, USER_GATEWAY);
        assert_eq!(user.unwrap().dns, USER_DNS);
        assert_eq!(user.unwrap().prefix, USER_PREFIX);
    }

    #[test]
    fn macs_are_local_unicast_and_differ_by_name() {
        let a = mac_for("a");
        assert_eq!(a[0] & 0b11, 0b10, "locally administered unicast");
        assert_eq!(a, mac_for("a"));
        assert_ne!(a, mac_for("b"));
    }
}
