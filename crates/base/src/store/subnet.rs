//! IPv4 subnets as networks and allowlists write them (`10.89.0.0/24`).

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An IPv4 subnet: `10.89.0.0/24`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Subnet {
    /// The network address (host bits zero).
    pub addr: Ipv4Addr,
    /// The prefix length.
    pub prefix: u8,
}

impl Subnet {
    fn mask(prefix: u8) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
    }

    /// The address `offset` hosts into the subnet.
    pub fn host(&self, offset: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) + offset)
    }

    /// How many addresses it spans.
    pub fn size(&self) -> u32 {
        1u32 << (32 - u32::from(self.prefix))
    }

    /// Whether `ip` is in it.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & Self::mask(self.prefix) == u32::from(self.addr)
    }

    /// Whether the two share any address.
    pub fn overlaps(&self, other: &Subnet) -> bool {
        self.contains(other.addr) || other.contains(self.addr)
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for Subnet {
    type Err = String;

    /// Parses `A.B.C.D/N`; host bits must be zero.
    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("subnet {s:?} needs a prefix length, e.g. 10.89.0.0/24"))?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("subnet {s:?}: {addr:?} is not an IPv4 address"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| format!("subnet {s:?}: the prefix length must be 0 to 32"))?;
        if u32::from(addr) & !Self::mask(prefix) != 0 {
            return Err(format!(
                "subnet {s:?} has host bits set; did you mean {}/{prefix}?",
                Ipv4Addr::from(u32::from(addr) & Self::mask(prefix))
            ));
        }
        Ok(Self { addr, prefix })
    }
}

impl Serialize for Subnet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Subnet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schemars")]
impl schemars::JsonSchema for Subnet {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Subnet".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "An IPv4 subnet, e.g. 10.89.0.0/24",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnets_parse_and_refuse_host_bits() {
        let s: Subnet = "10.89.3.0/24".parse().unwrap();
        assert_eq!(s.to_string(), "10.89.3.0/24");
        assert_eq!(s.host(1), Ipv4Addr::new(10, 89, 3, 1));
        assert!(s.contains(Ipv4Addr::new(10, 89, 3, 200)));
        assert!(!s.contains(Ipv4Addr::new(10, 89, 4, 1)));
        let err = "10.89.3.1/24".parse::<Subnet>().unwrap_err();
        assert!(err.contains("did you mean 10.89.3.0/24"), "{err}");
        assert!("10.89.3.0".parse::<Subnet>().is_err());
        assert!("10.89.3.0/33".parse::<Subnet>().is_err());
        let wide: Subnet = "10.0.0.0/8".parse().unwrap();
        assert!(wide.overlaps(&s) && s.overlaps(&wide));
        assert!(!s.overlaps(&"10.89.4.0/24".parse().unwrap()));
    }
}
