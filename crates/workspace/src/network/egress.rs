//! What a network's guests may reach beyond it: the egress mode and the
//! allowlist's entries (domains and CIDRs).

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

/// One allowlist entry: a domain (and its subdomains) or a CIDR.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AllowEntry {
    /// Addresses the network's resolver returns for this domain or any
    /// name under it.
    Domain(String),
    /// A literal range (a single address is `/32`).
    Cidr(Subnet),
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Domain(d) => f.write_str(d),
            Self::Cidr(c) => write!(f, "{c}"),
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

impl FromStr for AllowEntry {
    type Err = String;

    /// `example.com`, `10.1.2.3` or `10.1.0.0/16`.
    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(ip) = s.parse::<Ipv4Addr>() {
            return Ok(Self::Cidr(Subnet {
                addr: ip,
                prefix: 32,
            }));
        }
        if s.contains('/') {
            return s.parse().map(Self::Cidr);
        }
        let domain = s.trim_end_matches('.').to_ascii_lowercase();
        if valid_domain(&domain) {
            Ok(Self::Domain(domain))
        } else {
            Err(format!(
                "{s:?} is neither a domain (example.com) nor an IPv4 address or CIDR (10.0.0.0/8)"
            ))
        }
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
            "description": "A domain (it and the names under it), an IPv4 address or a CIDR",
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
        for bad in ["localhost", "-a.com", "a..com", "a b.com", "1.2.3.4/40", ""] {
            assert!(bad.parse::<AllowEntry>().is_err(), "{bad}");
        }
    }
}
