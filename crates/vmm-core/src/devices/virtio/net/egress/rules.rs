//! What a guest may reach: the policy as the filter holds it (plain
//! addresses, prefixes, ports and name patterns; the user-facing grammar
//! and its defaults are the workspace crate's) and the decision for one
//! destination.

use std::net::{IpAddr, Ipv4Addr};

/// How much is open before the rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterMode {
    /// Everything but the guarded ranges.
    All,
    /// Nothing; DNS questions are answered REFUSED.
    Nothing,
    /// Only what the rules name.
    Allowlist,
}

/// An address prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    /// Its first address.
    pub addr: IpAddr,
    /// Bits that count.
    pub len: u8,
}

impl Prefix {
    /// Whether `ip` is in it (an IPv4 prefix holds no IPv6 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let len = u32::from(self.len.min(32));
                let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let len = u32::from(self.len.min(128));
                let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Destinations a rule opens: a prefix, on one port or all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetRule {
    /// Where.
    pub prefix: Prefix,
    /// One port, or all (None).
    pub port: Option<u16>,
}

impl NetRule {
    fn allows(&self, dst: IpAddr, port: Option<u16>) -> bool {
        self.prefix.contains(dst)
            && match self.port {
                None => true,
                Some(p) => port == Some(p),
            }
    }
}

/// Names a rule opens: `example.org` and every name below it, or with
/// `*.example.org` only the names below it (as dnsmasq reads them, which
/// enforces the same rules on `tap` networks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamePattern {
    /// Lowercased, without a trailing dot.
    pub name: String,
    /// Only names below it, not itself (`*.`).
    pub below_only: bool,
}

impl NamePattern {
    /// Whether `name` (lowercased) is one it opens.
    pub fn matches(&self, name: &str) -> bool {
        let below = name.len() > self.name.len()
            && name.ends_with(&self.name)
            && name.as_bytes()[name.len() - self.name.len() - 1] == b'.';
        below || (!self.below_only && name == self.name)
    }
}

/// The policy the filter enforces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterPolicy {
    /// How much is open before the rules.
    pub mode: FilterMode,
    /// Prefixes (with ports) that are open whatever the mode but `Nothing`.
    pub nets: Vec<NetRule>,
    /// Names whose resolved addresses are open for their TTL.
    pub names: Vec<NamePattern>,
    /// Denied under `All` unless a rule opens them: the host's loopback as
    /// the guest sees it, link-local (the cloud metadata service), private
    /// and shared ranges.
    pub guarded: Vec<Prefix>,
    /// The network's DNS forwarder: the one resolver the guest may ask
    /// under `Allowlist`, whose answers teach the filter.
    pub resolver: Ipv4Addr,
}

/// Why a destination was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyReason {
    /// Egress `none`.
    Nothing,
    /// Not on the allowlist (nor an address of a name on it).
    NotAllowed,
    /// A guarded range (host loopback, link-local, private) no rule opens.
    Guarded,
    /// A DNS question for a name not on the allowlist.
    NameNotAllowed,
    /// DNS to another resolver than the network's.
    OtherResolver,
    /// An allowed name's answer gave a guarded address (DNS rebinding).
    GuardedAnswer,
}

impl DenyReason {
    /// A short phrase for events and `inspect`.
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::Nothing => "egress none",
            DenyReason::NotAllowed => "not on the allowlist",
            DenyReason::Guarded => "a host, link-local or private address no rule allows",
            DenyReason::NameNotAllowed => "a name not on the allowlist",
            DenyReason::OtherResolver => "DNS to another resolver than the network's",
            DenyReason::GuardedAnswer => {
                "a host, link-local or private address an allowed name resolved to (DNS rebinding)"
            }
        }
    }
}

impl FilterPolicy {
    /// Whether the guest may send to `dst` (`port` where the packet shows
    /// one); `learned` says whether `dst` is a current address of an
    /// allowed name.
    pub fn decide(&self, dst: IpAddr, port: Option<u16>, learned: bool) -> Result<(), DenyReason> {
        if self.mode == FilterMode::Nothing {
            return Err(DenyReason::Nothing);
        }
        if dst == IpAddr::V4(self.resolver) && port == Some(53) {
            return Ok(());
        }
        if self.nets.iter().any(|r| r.allows(dst, port)) {
            return Ok(());
        }
        // A learned address never opens a guarded range: a name's answer
        // is the name owner's to choose (DNS rebinding), a rule is the
        // user's. Only an explicit rule for the range does.
        let guarded = self.guarded.iter().any(|p| p.contains(dst));
        if learned && !guarded {
            return Ok(());
        }
        match self.mode {
            FilterMode::All if guarded => Err(DenyReason::Guarded),
            FilterMode::All => Ok(()),
            _ if learned => Err(DenyReason::GuardedAnswer),
            _ if port == Some(53) => Err(DenyReason::OtherResolver),
            _ => Err(DenyReason::NotAllowed),
        }
    }

    /// Whether a DNS question for `name` may go to the resolver.
    pub fn may_ask(&self, name: &str) -> bool {
        match self.mode {
            FilterMode::All => true,
            FilterMode::Nothing => false,
            FilterMode::Allowlist => self.names.iter().any(|p| p.matches(name)),
        }
    }

    /// Whether the addresses an answer gives for `name` are admitted.
    pub fn learns(&self, name: &str) -> bool {
        self.mode != FilterMode::Nothing && self.names.iter().any(|p| p.matches(name))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    pub fn prefix(addr: IpAddr, len: u8) -> Prefix {
        Prefix { addr, len }
    }

    /// The user network's defaults, with `mode`.
    pub fn policy(mode: FilterMode) -> FilterPolicy {
        FilterPolicy {
            mode,
            nets: Vec::new(),
            names: Vec::new(),
            guarded: vec![
                prefix(v4(10, 0, 0, 0), 8),
                prefix(v4(169, 254, 0, 0), 16),
                prefix(v4(192, 168, 0, 0), 16),
            ],
            resolver: Ipv4Addr::new(10, 0, 2, 3),
        }
    }

    #[test]
    fn a_learned_answer_never_opens_a_guarded_range() {
        for mode in [FilterMode::All, FilterMode::Allowlist] {
            let mut p = policy(mode);
            for guarded in [v4(169, 254, 169, 254), v4(10, 0, 2, 2), v4(192, 168, 1, 1)] {
                let refused = p.decide(guarded, Some(80), true);
                assert!(refused.is_err(), "{mode:?} {guarded}");
            }
            assert_eq!(
                policy(FilterMode::Allowlist).decide(v4(169, 254, 169, 254), Some(80), true),
                Err(DenyReason::GuardedAnswer)
            );
            assert_eq!(p.decide(v4(93, 184, 216, 34), Some(443), true), Ok(()));
            // An explicit rule for the range opens it.
            p.nets.push(NetRule {
                prefix: prefix(v4(169, 254, 169, 254), 32),
                port: None,
            });
            assert_eq!(p.decide(v4(169, 254, 169, 254), Some(80), true), Ok(()));
        }
    }

    #[test]
    fn prefixes_hold_what_they_should() {
        assert!(prefix(v4(10, 0, 0, 0), 8).contains(v4(10, 255, 1, 2)));
        assert!(!prefix(v4(10, 0, 0, 0), 8).contains(v4(11, 0, 0, 0)));
        assert!(prefix(v4(0, 0, 0, 0), 0).contains(v4(8, 8, 8, 8)));
        assert!(prefix(v4(1, 2, 3, 4), 32).contains(v4(1, 2, 3, 4)));
        assert!(!prefix(v4(1, 2, 3, 4), 32).contains("::1".parse().unwrap()));
        let six = prefix("fe80::".parse().unwrap(), 10);
        assert!(six.contains("fe80::1".parse().unwrap()));
        assert!(!six.contains("fec0::1".parse().unwrap()));
    }

    #[test]
    fn names_match_themselves_and_below_or_only_below_a_star() {
        let plain = NamePattern {
            name: "pypi.org".into(),
            below_only: false,
        };
        let below = NamePattern {
            name: "pythonhosted.org".into(),
            below_only: true,
        };
        assert!(plain.matches("pypi.org"));
        assert!(plain.matches("files.pypi.org"));
        assert!(!plain.matches("evil-pypi.org"));
        assert!(below.matches("files.pythonhosted.org"));
        assert!(!below.matches("pythonhosted.org"));
        assert!(!below.matches("evilpythonhosted.org"));
    }

    #[test]
    fn each_mode_decides_as_documented() {
        let mut all = policy(FilterMode::All);
        assert_eq!(all.decide(v4(93, 184, 216, 34), Some(443), false), Ok(()));
        assert_eq!(
            all.decide(v4(169, 254, 169, 254), Some(80), false),
            Err(DenyReason::Guarded)
        );
        assert_eq!(all.decide(v4(10, 0, 2, 3), Some(53), false), Ok(()));
        // host:8000 is the gateway's port 8000, and only that port.
        all.nets.push(NetRule {
            prefix: prefix(v4(10, 0, 2, 2), 32),
            port: Some(8000),
        });
        assert_eq!(all.decide(v4(10, 0, 2, 2), Some(8000), false), Ok(()));
        assert_eq!(
            all.decide(v4(10, 0, 2, 2), Some(8001), false),
            Err(DenyReason::Guarded)
        );
        let list = policy(FilterMode::Allowlist);
        assert_eq!(
            list.decide(v4(93, 184, 216, 34), Some(443), false),
            Err(DenyReason::NotAllowed)
        );
        assert_eq!(list.decide(v4(93, 184, 216, 34), Some(443), true), Ok(()));
        assert_eq!(
            list.decide(v4(1, 1, 1, 1), Some(53), false),
            Err(DenyReason::OtherResolver)
        );
        let none = policy(FilterMode::Nothing);
        assert_eq!(
            none.decide(v4(10, 0, 2, 3), Some(53), true),
            Err(DenyReason::Nothing)
        );
    }
}
