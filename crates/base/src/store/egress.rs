//! What a network's guests may reach beyond it: the egress mode and the
//! rules (domains, CIDRs with or without a port, host ports).

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::subnet::Subnet;

/// What a network's guests may reach beyond it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Egress {
    /// Anything the host can reach.
    All,
    /// Nothing but the network's own resolver and gateway.
    None,
    /// Only the listed domains (the addresses the network's resolver
    /// returned for them) and CIDRs.
    Allowlist,
}

impl fmt::Display for Egress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::All => "all",
            Self::None => "none",
            Self::Allowlist => "allowlist",
        })
    }
}

/// One rule of what a guest may reach.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AllowEntry {
    /// Addresses the network's resolver returns for this name or any name
    /// under it: `pypi.org`.
    Domain(String),
    /// Addresses it returns for names under this one, not the name
    /// itself: `*.pythonhosted.org`.
    Subdomains(String),
    /// A literal range (a single address is `/32`), every port.
    Cidr(Subnet),
    /// A literal range (or address) on one port: `10.0.0.0/8:5432`.
    CidrPort(Subnet, u16),
    /// A port on the host's loopback, reached in the guest as
    /// `host.microagent.internal:PORT`: `host:8000`.
    HostPort(u16),
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Domain(d) => f.write_str(d),
            Self::Subdomains(d) => write!(f, "*.{d}"),
            Self::Cidr(c) => write!(f, "{c}"),
            Self::CidrPort(c, port) => write!(f, "{c}:{port}"),
            Self::HostPort(port) => write!(f, "host:{port}"),
        }
    }
}

fn valid_domain(d: &str) -> bool {
    d.len() <= 253
        && d.contains('.')
        && d.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn port(s: &str, whole: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("{whole:?}: {s:?} is not a port (1-65535)")),
    }
}

fn cidr(s: &str) -> Result<Subnet, String> {
    if let Ok(ip) = s.parse::<Ipv4Addr>() {
        return Ok(Subnet {
            addr: ip,
            prefix: 32,
        });
    }
    s.parse()
}

impl FromStr for AllowEntry {
    type Err = String;

    /// `example.com`, `*.example.com`, `10.1.2.3`, `10.1.0.0/16`,
    /// `10.1.0.0/16:5432` or `host:8000`.
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("host:") {
            return port(p, s).map(Self::HostPort);
        }
        if s.starts_with(|c: char| c.is_ascii_digit()) {
            return match s.rsplit_once(':') {
                Some((range, p)) => Ok(Self::CidrPort(cidr(range)?, port(p, s)?)),
                None => cidr(s).map(Self::Cidr),
            };
        }
        let (below, name) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let domain = name.trim_end_matches('.').to_ascii_lowercase();
        if !valid_domain(&domain) {
            return Err(format!(
                "{s:?} is not a rule: a domain (example.com, *.example.com), an IPv4 address or CIDR with or without a port (10.0.0.0/8, 10.1.2.3:5432), or host:PORT"
            ));
        }
        Ok(if below {
            Self::Subdomains(domain)
        } else {
            Self::Domain(domain)
        })
    }
}

/// What a running workspace's egress filter refused.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct EgressDenials {
    /// Refusals since its VMM started.
    pub denied: u64,
    /// The last ones, oldest first.
    pub denials: Vec<EgressDenial>,
}

/// A connection (or DNS question) the egress policy refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct EgressDenial {
    /// Where the guest was going.
    pub dst: std::net::IpAddr,
    /// The destination port, where the packet showed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `tcp`, `udp`, `icmp`, `dns` (a question) or `ip`.
    pub protocol: String,
    /// The name asked about, for a refused DNS question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Why, in words.
    pub reason: String,
    /// Unix ms.
    pub at_ms: u64,
}

impl fmt::Display for EgressDenial {
    /// `tcp 10.0.2.2:8001: why`, `dns 10.0.2.3:53 (name): why`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.protocol, self.dst)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        if let Some(name) = &self.name {
            write!(f, " ({name})")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl Serialize for AllowEntry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AllowEntry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schemars")]
impl schemars::JsonSchema for AllowEntry {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AllowEntry".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A domain (it and the names under it; *.domain: only the names under it), an IPv4 address or CIDR with or without :PORT, or host:PORT (a port on the host's loopback)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_entries_are_domains_addresses_or_cidrs() {
        assert_eq!(
            "PyPI.org.".parse::<AllowEntry>().unwrap(),
            AllowEntry::Domain("pypi.org".into())
        );
        assert_eq!(
            "192.0.2.7".parse::<AllowEntry>().unwrap().to_string(),
            "192.0.2.7/32"
        );
        assert_eq!(
            "10.0.0.0/8".parse::<AllowEntry>().unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            "*.PythonHosted.org".parse::<AllowEntry>().unwrap(),
            AllowEntry::Subdomains("pythonhosted.org".into())
        );
        assert_eq!(
            "10.1.2.3:5432".parse::<AllowEntry>().unwrap().to_string(),
            "10.1.2.3/32:5432"
        );
        assert_eq!(
            "host:8000".parse::<AllowEntry>().unwrap(),
            AllowEntry::HostPort(8000)
        );
        for entry in [
            "*.a.com",
            "10.0.0.0/8:5432",
            "host:1",
            "a.com",
            "1.2.3.4/32",
        ] {
            let parsed: AllowEntry = entry.parse().unwrap();
            assert_eq!(parsed.to_string().parse::<AllowEntry>().unwrap(), parsed);
        }
        for bad in [
            "localhost",
            "-a.com",
            "a..com",
            "a b.com",
            "1.2.3.4/40",
            "",
            "host:0",
            "host:http",
            "1.2.3.4:99999",
            "*.com",
            "**.a.com",
        ] {
            assert!(bad.parse::<AllowEntry>().is_err(), "{bad}");
        }
    }
}
