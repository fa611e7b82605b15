//! A workspace's egress policy: checked against its network, and on a
//! `user` network turned into what the VMM's filter enforces
//! (`vmm_core`'s `net::egress`): the mode, the rules turned into prefixes,
//! ports and name patterns, and the ranges guarded by default. passt
//! forwards whatever the guest sends, from the host, so the host's own
//! loopback (the gateway), link-local addresses (the cloud metadata
//! service), private and shared ranges are denied unless a rule opens
//! them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use vmm_core::devices::virtio::net::egress::rules::{
    FilterMode, FilterPolicy, NamePattern, NetRule, Prefix,
};

use super::objects::MAX_ALLOW;
use super::{Backend, Network, NetworkError, USER_DNS, USER_GATEWAY};
use crate::store::egress::{AllowEntry, Egress};
use crate::store::subnet::Subnet;

/// Ranges a guest on a `user` network reaches only through a rule: the
/// gateway (the host's loopback, through passt), loopback, link-local,
/// private (RFC 1918, unique local), shared (RFC 6598) and multicast
/// ranges, and the IPv6 spellings of IPv4 addresses (`::ffff:0:0/96`, a
/// dual-stack socket sends them as IPv4) and `::` (the local host).
pub const GUARDED: [(IpAddr, u8); 15] = [
    (IpAddr::V4(USER_GATEWAY), 32),
    (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
    (IpAddr::V4(Ipv4Addr::new(0, 0, 0, 0)), 8),
    (IpAddr::V4(Ipv4Addr::new(169, 254, 0, 0)), 16),
    (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)), 8),
    (IpAddr::V4(Ipv4Addr::new(172, 16, 0, 0)), 12),
    (IpAddr::V4(Ipv4Addr::new(192, 168, 0, 0)), 16),
    (IpAddr::V4(Ipv4Addr::new(100, 64, 0, 0)), 10),
    (IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)), 10),
    (IpAddr::V6(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0)), 7),
    (IpAddr::V4(Ipv4Addr::new(224, 0, 0, 0)), 4),
    (IpAddr::V6(Ipv6Addr::LOCALHOST), 128),
    (IpAddr::V6(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0)), 8),
    (IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0)), 96),
    (IpAddr::V6(Ipv6Addr::UNSPECIFIED), 128),
];

/// Whether a rule opens the host's side of the network: a host port, or
/// an address range that is wider than one address or touches a guarded
/// range. Such rules are a human's to give: over MCP they need the
/// server's grant (`serve mcp --allow-host-egress`). A name does not:
/// what it resolves to never opens a guarded range.
pub fn opens_host(rule: &AllowEntry) -> bool {
    let (net, len) = match rule {
        AllowEntry::Domain(_) | AllowEntry::Subdomains(_) => return false,
        AllowEntry::HostPort(_) => return true,
        AllowEntry::Cidr(c) | AllowEntry::CidrPort(c, _) => {
            let p = prefix(c);
            (p.addr, p.len)
        }
    };
    let single = match net {
        IpAddr::V4(_) => len >= 32,
        IpAddr::V6(_) => len >= 128,
    };
    let rule = Prefix { addr: net, len };
    !single
        || GUARDED.iter().any(|&(addr, glen)| {
            let guarded = Prefix { addr, len: glen };
            guarded.contains(net) || rule.contains(addr)
        })
}

/// Checks a workspace's own egress policy (`spec.egress`, `spec.allow`)
/// against its network: only a `user` network takes one (a `tap`
/// network's is the network's, enforced by nftables for all its guests).
pub fn validate_workspace_policy(
    net: &Network,
    spec: &crate::store::spec::WorkspaceSpec,
) -> Result<(), NetworkError> {
    let bad = |m: String| Err(NetworkError::Invalid(m));
    if spec.egress.is_none() && spec.allow.is_empty() {
        return Ok(());
    }
    match net.backend {
        None => {
            return bad(format!(
                "network `{}` reaches nothing: egress and allow rules need the `user` network",
                net.name
            ))
        }
        Some(Backend::Tap) => {
            return bad(format!(
                "network `{}` is a tap network, whose policy is its own: set it with `network create {} --egress ... --allow ...`",
                net.name, net.name
            ))
        }
        Some(Backend::User) => {}
    }
    match spec.egress {
        Some(Egress::None) if !spec.allow.is_empty() => {
            return bad(
                "egress `none` opens nothing, rules included; use `allowlist` with the rules"
                    .into(),
            )
        }
        Some(Egress::Allowlist) if spec.allow.is_empty() && net.allow.is_empty() => {
            return bad("egress `allowlist` needs at least one rule (--allow)".into())
        }
        _ => {}
    }
    if spec.allow.len() > MAX_ALLOW {
        return bad(format!(
            "{} allow rules; at most {MAX_ALLOW}",
            spec.allow.len()
        ));
    }
    Ok(())
}

fn prefix(s: &Subnet) -> Prefix {
    Prefix {
        addr: IpAddr::V4(s.addr),
        len: s.prefix,
    }
}

/// The filter's policy for `egress` and `rules` on the `user` network.
pub fn filter_policy(egress: Egress, rules: &[AllowEntry]) -> FilterPolicy {
    let mut nets = Vec::new();
    let mut names = Vec::new();
    for rule in rules {
        match rule {
            AllowEntry::Domain(d) => names.push(NamePattern {
                name: d.clone(),
                below_only: false,
            }),
            AllowEntry::Subdomains(d) => names.push(NamePattern {
                name: d.clone(),
                below_only: true,
            }),
            AllowEntry::Cidr(c) => nets.push(NetRule {
                prefix: prefix(c),
                port: None,
            }),
            AllowEntry::CidrPort(c, port) => nets.push(NetRule {
                prefix: prefix(c),
                port: Some(*port),
            }),
            AllowEntry::HostPort(port) => nets.push(NetRule {
                prefix: Prefix {
                    addr: IpAddr::V4(USER_GATEWAY),
                    len: 32,
                },
                port: Some(*port),
            }),
        }
    }
    FilterPolicy {
        mode: match egress {
            Egress::All => FilterMode::All,
            Egress::None => FilterMode::Nothing,
            Egress::Allowlist => FilterMode::Allowlist,
        },
        nets,
        names,
        guarded: GUARDED
            .iter()
            .map(|&(addr, len)| Prefix { addr, len })
            .collect(),
        resolver: USER_DNS,
    }
}

/// Whether passt must map the gateway to the host's loopback: only when a
/// rule opens a host port (otherwise `--no-map-gw`).
pub fn maps_host(rules: &[AllowEntry]) -> bool {
    rules.iter().any(|r| matches!(r, AllowEntry::HostPort(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn rules_that_open_the_host_are_told_apart() {
        for rule in [
            "host:8000",
            "169.254.169.254/32",
            "127.0.0.1/32",
            "10.1.0.0/16:5432",
            "192.168.1.7/32",
            "100.64.0.1/32",
            "224.0.0.251/32",
            "0.0.0.0/0",
            "8.8.0.0/16",
        ] {
            let entry: AllowEntry = rule.parse().unwrap();
            assert!(opens_host(&entry), "{rule}");
        }
        for rule in [
            "pypi.org",
            "*.pythonhosted.org",
            "93.184.216.34/32",
            "1.1.1.1/32:53",
        ] {
            let entry: AllowEntry = rule.parse().unwrap();
            assert!(!opens_host(&entry), "{rule}");
        }
    }

    #[test]
    fn the_default_opens_the_internet_and_guards_the_host() {
        let p = filter_policy(Egress::All, &[]);
        assert_eq!(p.decide(v4(93, 184, 216, 34), Some(443), false), Ok(()));
        for guarded in [
            v4(10, 0, 2, 2),
            v4(169, 254, 169, 254),
            v4(192, 168, 1, 1),
            v4(172, 20, 0, 1),
            v4(100, 64, 0, 1),
            v4(127, 0, 0, 1),
        ] {
            assert!(p.decide(guarded, Some(80), false).is_err(), "{guarded}");
        }
        assert!(!maps_host(&[]));
    }

    #[test]
    fn rules_open_what_they_name_and_no_more() {
        let rules: Vec<AllowEntry> = [
            "host:8000",
            "10.1.0.0/16:5432",
            "*.pythonhosted.org",
            "pypi.org",
        ]
        .iter()
        .map(|r| r.parse().unwrap())
        .collect();
        let p = filter_policy(Egress::All, &rules);
        assert_eq!(p.decide(v4(10, 0, 2, 2), Some(8000), false), Ok(()));
        assert!(p.decide(v4(10, 0, 2, 2), Some(8001), false).is_err());
        assert_eq!(p.decide(v4(10, 1, 9, 9), Some(5432), false), Ok(()));
        assert!(p.decide(v4(10, 1, 9, 9), Some(22), false).is_err());
        assert!(maps_host(&rules));
        let list = filter_policy(Egress::Allowlist, &rules);
        assert!(list.may_ask("files.pythonhosted.org"));
        assert!(!list.may_ask("pythonhosted.org"));
        assert!(list.may_ask("pypi.org"));
        assert!(!list.may_ask("example.org"));
        assert!(list.decide(v4(93, 184, 216, 34), Some(443), false).is_err());
        let none = filter_policy(Egress::None, &rules);
        assert!(none.decide(v4(10, 0, 2, 2), Some(8000), false).is_err());
    }
}
