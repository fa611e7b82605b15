//! Published ports: a host address and port whose TCP connections reach a
//! port on the guest's loopback, through the workspace's VMM process and the
//! guest agent (docs/networking.md), whatever the network. This module holds
//! the mapping, its checks and the operations on a workspace's set; the VMM
//! process's side is the private `port_forward` module.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::code::ErrorCode;
use crate::remedy::Remedy;

/// Why a port mapping or a set of them is refused.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// A mapping, or the set, is malformed or too large.
    #[error("{0}")]
    Invalid(String),
    /// A host address cannot be listened on: in use, or not an address
    /// of this machine.
    #[error("host address {addr} cannot be listened on")]
    Unavailable {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl PortError {
    /// The stable code: an address in use is CONFLICT, the rest
    /// INVALID_INPUT.
    pub fn code(&self) -> ErrorCode {
        match self {
            PortError::Unavailable { source, .. }
                if source.kind() == std::io::ErrorKind::AddrInUse =>
            {
                ErrorCode::Conflict
            }
            _ => ErrorCode::InvalidInput,
        }
    }

    /// What the caller can do about it.
    pub fn remedy(&self) -> Option<Remedy> {
        match self {
            PortError::Unavailable { addr, .. } => Some(Remedy::ChooseAnotherPort { addr: *addr }),
            PortError::Invalid(_) => None,
        }
    }
}

type Result<T, E = PortError> = std::result::Result<T, E>;

/// Most ports one workspace publishes.
pub const MAX_PORTS: usize = 32;
/// The host address a mapping listens on unless it names one.
pub const DEFAULT_HOST_IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// One published port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct PortMapping {
    /// Host address the VMM process listens on (127.0.0.1 unless given).
    #[serde(default = "default_host_ip")]
    pub host_ip: IpAddr,
    /// Host TCP port.
    pub host_port: u16,
    /// TCP port on the guest's loopback (127.0.0.1) that each connection
    /// reaches.
    pub guest_port: u16,
}

fn default_host_ip() -> IpAddr {
    DEFAULT_HOST_IP
}

impl PortMapping {
    /// Listens on 127.0.0.1:`host_port`.
    pub fn local(host_port: u16, guest_port: u16) -> Self {
        Self {
            host_ip: DEFAULT_HOST_IP,
            host_port,
            guest_port,
        }
    }

    /// The host socket address.
    pub fn host_addr(&self) -> SocketAddr {
        SocketAddr::new(self.host_ip, self.host_port)
    }

    fn check(&self) -> Result<()> {
        if self.host_port == 0 || self.guest_port == 0 {
            return Err(PortError::Invalid(format!(
                "port mapping {self}: ports are 1 to 65535"
            )));
        }
        Ok(())
    }
}

impl fmt::Display for PortMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host_addr(), self.guest_port)
    }
}

impl FromStr for PortMapping {
    type Err = PortError;

    /// `[HOST_IP:]HOST_PORT:GUEST_PORT`; an IPv6 host address in brackets.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            PortError::Invalid(format!(
                "port mapping {s:?}: use [HOST_IP:]HOST_PORT:GUEST_PORT, e.g. 8080:80 or 127.0.0.1:8080:80"
            ))
        };
        let (host, guest) = s.rsplit_once(':').ok_or_else(bad)?;
        let guest_port = guest.parse::<u16>().map_err(|_| bad())?;
        let (host_ip, host_port) = parse_host_addr(host).ok_or_else(bad)?;
        let mapping = Self {
            host_ip,
            host_port,
            guest_port,
        };
        mapping.check()?;
        Ok(mapping)
    }
}

/// `[HOST_IP:]HOST_PORT` (host address 127.0.0.1 unless given; an IPv6
/// one in brackets), or None when malformed.
pub fn parse_host_addr(s: &str) -> Option<(IpAddr, u16)> {
    let (ip, port) = match s.rsplit_once(':') {
        None => (DEFAULT_HOST_IP, s),
        Some((ip, port)) => {
            let ip = ip
                .strip_prefix('[')
                .and_then(|i| i.strip_suffix(']'))
                .unwrap_or(ip);
            (ip.parse().ok()?, port)
        }
    };
    Some((ip, port.parse().ok()?))
}

/// Checks a workspace's set: valid ports, at most [`MAX_PORTS`], no host
/// address and port twice.
pub fn validate(ports: &[PortMapping]) -> Result<()> {
    if ports.len() > MAX_PORTS {
        return Err(PortError::Invalid(format!(
            "{} published ports; at most {MAX_PORTS} are allowed",
            ports.len()
        )));
    }
    for (i, p) in ports.iter().enumerate() {
        p.check()?;
        if ports[..i].iter().any(|q| q.host_addr() == p.host_addr()) {
            return Err(PortError::Invalid(format!(
                "host address {} is published twice",
                p.host_addr()
            )));
        }
    }
    Ok(())
}

/// Binds `mapping`'s host address: in use is [`PortError::Unavailable`],
/// as is an address that is not this machine's.
pub fn bind(mapping: &PortMapping) -> Result<TcpListener> {
    TcpListener::bind(mapping.host_addr()).map_err(|source| PortError::Unavailable {
        addr: mapping.host_addr(),
        source,
    })
}

/// Fails when a mapping's host address cannot be listened on now (checked
/// by binding and letting go, so a later start can still find it taken).
pub fn check_free(ports: &[PortMapping]) -> Result<()> {
    for p in ports {
        drop(bind(p)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_parse_and_print() {
        let p: PortMapping = "8080:80".parse().unwrap();
        assert_eq!(p, PortMapping::local(8080, 80));
        assert_eq!(p.to_string(), "127.0.0.1:8080:80");
        let p: PortMapping = "0.0.0.0:9000:3000".parse().unwrap();
        assert_eq!(p.host_addr(), "0.0.0.0:9000".parse().unwrap());
        let p: PortMapping = "[::1]:8443:443".parse().unwrap();
        assert_eq!(p.host_addr(), "[::1]:8443".parse().unwrap());
        assert_eq!(p.to_string(), "[::1]:8443:443");
        assert_eq!(p.to_string().parse::<PortMapping>().unwrap(), p);
        for bad in [
            "",
            "80",
            "a:80",
            "80:b",
            "0:80",
            "80:0",
            "65536:80",
            "1.2.3:80:80",
            "x:1:2:3",
        ] {
            let e = bad.parse::<PortMapping>().unwrap_err();
            assert_eq!(e.code(), crate::code::ErrorCode::InvalidInput, "{bad}: {e}");
        }
    }

    #[test]
    fn a_set_has_no_host_address_twice_and_a_bound() {
        let a = PortMapping::local(8080, 80);
        let b = PortMapping::local(8081, 80);
        validate(&[a, b]).unwrap();
        assert!(validate(&[a, PortMapping::local(8080, 81)]).is_err());
        let many: Vec<_> = (1..=MAX_PORTS as u16 + 1)
            .map(|p| PortMapping::local(20000 + p, 80))
            .collect();
        assert!(validate(&many).is_err());
        assert!(validate(&many[..MAX_PORTS]).is_ok());
    }

    #[test]
    fn serde_defaults_the_host_address() {
        let p: PortMapping =
            serde_json::from_str(r#"{"host_port": 8080, "guest_port": 80}"#).unwrap();
        assert_eq!(p, PortMapping::local(8080, 80));
    }

    #[test]
    fn a_taken_address_is_port_unavailable() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let e = check_free(&[PortMapping::local(port, 80)]).unwrap_err();
        assert_eq!(e.code(), crate::code::ErrorCode::Conflict, "{e}");
        drop(held);
        check_free(&[PortMapping::local(port, 80)]).unwrap();
    }
}
