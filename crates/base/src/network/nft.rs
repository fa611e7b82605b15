//! The nftables table of the `tap` networks (`table ip microagent`): NAT
//! for their subnets, and per network a chain that enforces its egress
//! policy on what its guests send through or to the host. The table is
//! ours alone and replaced whole on every apply; other tables' rules still
//! apply to the same packets (a DROP policy elsewhere wins).

use std::fmt::Write;

use super::{AllowEntry, Backend, Egress, Network};

/// Our table's name (family `ip`).
pub const TABLE: &str = "microagent";

/// The set that holds a network's allowed CIDRs.
pub fn allow_set(net: &Network) -> String {
    format!("allow{}", net.index)
}

/// The set the network's resolver fills with the addresses of its allowed
/// domains; each element expires after [`RESOLVED_SECONDS`].
pub fn resolved_set(net: &Network) -> String {
    format!("resolved{}", net.index)
}

/// How long an address a resolver answer admitted stays admitted. The
/// resolver hands out and caches answers for at most half of it
/// ([`ANSWER_TTL_CAP_SECONDS`]), so no guest holds an answer whose address
/// has already expired, and an address a name no longer has goes within
/// the hour (connections already open stay open).
pub const RESOLVED_SECONDS: u32 = 3600;
/// The longest TTL the network's resolver gives or caches an answer for.
pub const ANSWER_TTL_CAP_SECONDS: u32 = RESOLVED_SECONDS / 2;

/// The ruleset for `networks` (only `tap` ones count), as `nft -f` reads
/// it: a table that replaces any earlier one atomically.
pub fn ruleset(networks: &[Network]) -> String {
    let taps: Vec<&Network> = networks
        .iter()
        .filter(|n| n.backend == Some(Backend::Tap))
        .collect();
    let mut r = String::new();
    // Declaring then deleting makes the delete succeed on a host that has
    // no table yet; nft applies the file as one transaction.
    let _ = writeln!(r, "table ip {TABLE} {{}}\ndelete table ip {TABLE}");
    let _ = writeln!(r, "table ip {TABLE} {{");
    for net in taps.iter().filter(|n| n.egress == Egress::Allowlist) {
        let cidrs: Vec<String> = net
            .allow
            .iter()
            .filter_map(|a| match a {
                AllowEntry::Cidr(c) => Some(c.to_string()),
                _ => None,
            })
            .collect();
        let _ = writeln!(r, "  set {} {{", allow_set(net));
        let _ = writeln!(r, "    type ipv4_addr; flags interval;");
        if !cidrs.is_empty() {
            let _ = writeln!(r, "    elements = {{ {} }}", cidrs.join(", "));
        }
        let _ = writeln!(r, "  }}");
        let _ = writeln!(r, "  set {} {{", resolved_set(net));
        let _ = writeln!(
            r,
            "    type ipv4_addr; flags timeout; timeout {RESOLVED_SECONDS}s;"
        );
        let _ = writeln!(r, "  }}");
    }
    let _ = writeln!(r, "  chain input {{");
    let _ = writeln!(
        r,
        "    type filter hook input priority filter; policy accept;"
    );
    for net in &taps {
        let (Some(br), Some(gw)) = (net.bridge(), net.gateway()) else {
            continue;
        };
        let _ = writeln!(
            r,
            "    iifname \"{br}\" ct state established,related accept"
        );
        let _ = writeln!(r, "    iifname \"{br}\" ip daddr {gw} udp dport 53 accept");
        let _ = writeln!(r, "    iifname \"{br}\" ip daddr {gw} tcp dport 53 accept");
        // The host itself (host.microagent.internal) is egress like any
        // other destination.
        let _ = writeln!(r, "    iifname \"{br}\" jump egress{}", net.index);
    }
    let _ = writeln!(r, "  }}");
    let _ = writeln!(r, "  chain forward {{");
    let _ = writeln!(
        r,
        "    type filter hook forward priority filter; policy accept;"
    );
    for net in &taps {
        let Some(br) = net.bridge() else { continue };
        let _ = writeln!(r, "    iifname \"{br}\" jump egress{}", net.index);
        let _ = writeln!(
            r,
            "    oifname \"{br}\" ct state established,related accept"
        );
        // Nothing outside opens connections to guests (published ports
        // reach them over vsock).
        let _ = writeln!(r, "    oifname \"{br}\" drop");
    }
    let _ = writeln!(r, "  }}");
    for net in &taps {
        let _ = writeln!(r, "  chain egress{} {{", net.index);
        let _ = writeln!(r, "    ct state established,related accept");
        match net.egress {
            Egress::All => {
                let _ = writeln!(r, "    accept");
            }
            Egress::Allowlist => {
                let _ = writeln!(r, "    ip daddr @{} accept", allow_set(net));
                let _ = writeln!(r, "    ip daddr @{} accept", resolved_set(net));
                for (dst, port) in port_rules(net) {
                    for proto in ["tcp", "udp"] {
                        let _ = writeln!(r, "    ip daddr {dst} {proto} dport {port} accept");
                    }
                }
            }
            Egress::None => {}
        }
        // Refused at once, not dropped: a denied connection fails fast
        // with a clear error instead of timing out.
        let _ = writeln!(r, "    meta l4proto tcp reject with tcp reset");
        let _ = writeln!(r, "    reject with icmp type admin-prohibited");
        let _ = writeln!(r, "  }}");
    }
    let _ = writeln!(r, "  chain postrouting {{");
    let _ = writeln!(
        r,
        "    type nat hook postrouting priority srcnat; policy accept;"
    );
    for net in taps.iter().filter(|n| n.egress != Egress::None) {
        let (Some(br), Some(subnet)) = (net.bridge(), net.subnet) else {
            continue;
        };
        let _ = writeln!(r, "    ip saddr {subnet} oifname != \"{br}\" masquerade");
    }
    let _ = writeln!(r, "  }}");
    let _ = writeln!(r, "}}");
    r
}

/// A network's rules with a port: (destination, port), `host:PORT` being
/// its gateway (host.microagent.internal).
fn port_rules(net: &Network) -> Vec<(String, u16)> {
    net.allow
        .iter()
        .filter_map(|a| match a {
            AllowEntry::CidrPort(c, port) => Some((c.to_string(), *port)),
            AllowEntry::HostPort(port) => Some((net.gateway()?.to_string(), *port)),
            _ => None,
        })
        .collect()
}

/// The bridge-family table that holds each tap guest to its own MAC and
/// IPv4 address (anti-spoofing), one chain per TAP device; kept apart from
/// [`TABLE`], which setup replaces whole, because workspaces add and
/// remove their chains as they start and are deleted.
pub const GUARD_TABLE: &str = "microagent_guard";

fn guard_chain(tap: &str) -> String {
    format!("g_{tap}")
}

/// The `nft -f` script that puts `tap`'s guest under guard: frames it sends
/// must carry `mac` and, for IPv4 and ARP, `ip`; it sends no IPv6 (the tap
/// networks are IPv4). Idempotent: the chain is flushed and filled again.
pub fn guard_script(tap: &str, mac: [u8; 6], ip: std::net::Ipv4Addr) -> String {
    let chain = guard_chain(tap);
    let mac = mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let t = format!("bridge {GUARD_TABLE}");
    format!(
        "add table {t}\n\
         add map {t} taps {{ type ifname : verdict; }}\n\
         add chain {t} prerouting {{ type filter hook prerouting priority -300; policy accept; }}\n\
         flush chain {t} prerouting\n\
         add rule {t} prerouting iifname vmap @taps\n\
         add chain {t} {chain}\n\
         flush chain {t} {chain}\n\
         add rule {t} {chain} ether saddr != {mac} drop\n\
         add rule {t} {chain} ether type ip ip saddr != {ip} drop\n\
         add rule {t} {chain} ether type arp arp saddr ether != {mac} drop\n\
         add rule {t} {chain} ether type arp arp saddr ip != {ip} drop\n\
         add rule {t} {chain} ether type ip6 drop\n\
         add element {t} taps {{ \"{tap}\" : jump {chain} }}\n"
    )
}

/// The script that removes `tap`'s guard (when its workspace is deleted).
pub fn unguard_script(tap: &str) -> String {
    let t = format!("bridge {GUARD_TABLE}");
    format!(
        "delete element {t} taps {{ \"{tap}\" }}\ndelete chain {t} {}\n",
        guard_chain(tap)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(name: &str, index: u8, egress: Egress, allow: &[&str]) -> Network {
        Network {
            name: name.into(),
            builtin: false,
            backend: Some(Backend::Tap),
            subnet: Some(format!("10.89.{index}.0/24").parse().unwrap()),
            egress,
            allow: allow.iter().map(|a| a.parse().unwrap()).collect(),
            allow_peers: false,
            index,
            created_at_ms: 1,
        }
    }

    #[test]
    fn a_guard_names_the_guests_own_addresses_and_is_undone_by_name() {
        let script = guard_script(
            "ma2t5",
            [2, 0x4d, 1, 2, 3, 0xab],
            "10.89.2.5".parse().unwrap(),
        );
        assert!(
            script.contains("ether saddr != 02:4d:01:02:03:ab drop"),
            "{script}"
        );
        assert!(script.contains("ip saddr != 10.89.2.5 drop"), "{script}");
        assert!(
            script.contains("arp saddr ip != 10.89.2.5 drop"),
            "{script}"
        );
        assert!(script.contains("\"ma2t5\" : jump g_ma2t5"), "{script}");
        // Filling a chain again replaces its rules instead of adding.
        assert!(script.contains("flush chain bridge microagent_guard g_ma2t5"));
        let undo = unguard_script("ma2t5");
        assert!(
            undo.contains("delete chain bridge microagent_guard g_ma2t5"),
            "{undo}"
        );
    }

    #[test]
    fn each_policy_gets_its_chain() {
        let rules = ruleset(&[
            net("open", 0, Egress::All, &[]),
            net("shut", 1, Egress::None, &[]),
            net(
                "some",
                2,
                Egress::Allowlist,
                &[
                    "pypi.org",
                    "192.0.2.0/24",
                    "198.51.100.7",
                    "203.0.113.0/24:443",
                    "host:8000",
                ],
            ),
            Network::user(),
        ]);
        let chain = |n: u8| {
            let start = rules.find(&format!("chain egress{n} {{")).unwrap();
            let end = start + rules[start..].find("  }").unwrap();
            rules[start..end].to_owned()
        };
        let accepts_all = |c: String| c.lines().any(|l| l.trim() == "accept");
        assert!(accepts_all(chain(0)), "{rules}");
        assert!(!accepts_all(chain(1)) && !accepts_all(chain(2)), "{rules}");
        assert!(chain(1).contains("reject"));
        assert!(chain(2).contains("ip daddr @allow2 accept"));
        // Resolved addresses expire; answers live at most half as long.
        assert!(chain(2).contains("ip daddr @resolved2 accept"));
        assert!(
            rules.contains("set resolved2 {\n    type ipv4_addr; flags timeout; timeout 3600s;"),
            "{rules}"
        );
        // Rules with a port, on TCP and UDP; host:PORT is the gateway.
        assert!(chain(2).contains("ip daddr 203.0.113.0/24 tcp dport 443 accept"));
        assert!(chain(2).contains("ip daddr 203.0.113.0/24 udp dport 443 accept"));
        assert!(
            chain(2).contains("ip daddr 10.89.2.1 tcp dport 8000 accept"),
            "{rules}"
        );
        assert!(
            rules.contains("elements = { 192.0.2.0/24, 198.51.100.7/32 }"),
            "{rules}"
        );
        assert!(
            !rules.contains("pypi.org"),
            "domains go to the resolver, not the ruleset"
        );
        // NAT for the networks that leave the host; none for `none`.
        assert!(rules.contains("ip saddr 10.89.0.0/24 oifname != \"microagent0\" masquerade"));
        assert!(!rules.contains("10.89.1.0/24 oifname"));
        // DNS to the network's own resolver is always open.
        assert!(rules.contains("iifname \"microagent1\" ip daddr 10.89.1.1 udp dport 53 accept"));
        // Only our table, replaced whole.
        assert!(rules.starts_with("table ip microagent {}\ndelete table ip microagent\n"));
        assert_eq!(rules.matches("table ip ").count(), 3);
    }

    #[test]
    fn no_tap_networks_leave_an_empty_table() {
        let rules = ruleset(&[Network::user(), Network::none()]);
        assert!(
            !rules.contains("jump") && !rules.contains("masquerade"),
            "{rules}"
        );
    }
}
