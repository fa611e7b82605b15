//! Services: sidecars such as redis or postgres that a workspace names at
//! create. Each runs in a microVM of its own (its *companion*, a
//! workspace in the reserved namespace [`SERVICE_NAMESPACE`] with no
//! network), and the workspace's guest reaches its ports by the service's
//! name: the guest agent listens on the service's loopback address
//! ([`guest_addr`]) and carries each connection over vsock to the host
//! port [`relay_vsock_port`], which the workspace's VMM routes to the
//! relay socket the companion's VMM serves in the workspace's directory
//! (`services/<vsock port>.sock`, [`crate::store::workspace_dir`]), and
//! the companion's VMM to the service's guest port. No network joins the
//! two guests, and no other workspace reaches the socket.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Why a workspace's services, or what a companion serves, are refused
/// (their env keys and values are the spec's to check, as the
/// workspace's own).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceSpecError {
    /// A value is out of range or malformed.
    #[error("{0}")]
    Invalid(String),
}

/// Most bytes of one word of a service's command.
pub const MAX_COMMAND_WORD_BYTES: usize = 4096;

/// The reserved namespace of the companions: no caller may name it.
pub const SERVICE_NAMESPACE: &str = "microagent-svc";
/// Most services one workspace names.
pub const MAX_SERVICES: usize = 8;
/// Most ports one service serves.
pub const MAX_SERVICE_PORTS: usize = 8;
/// Most ports all of a workspace's services serve together: the guest
/// agent's limit of forwards (`guest_agent::agent` `MAX_FORWARDS`).
pub const MAX_SERVICE_PORTS_IN_ALL: usize = 32;
/// Longest service name (a companion's name adds 17 characters).
pub const MAX_SERVICE_NAME_LEN: usize = 40;
/// Most words of a service's command, and bytes of one.
pub const MAX_COMMAND_WORDS: usize = 256;
/// The host vsock port of a workspace's first service port; service `i`'s
/// port `j` is `SERVICE_VSOCK_BASE + i * MAX_SERVICE_PORTS + j` (above the
/// agent's port 1024 and every port the VMM uses for itself).
pub const SERVICE_VSOCK_BASE: u32 = 50_000;
/// The directory of a workspace's relay sockets, `<vsock port>.sock` each.
pub const SERVICES_DIR: &str = "services";

/// A service a workspace names (devbox's `services` entries).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct ServiceSpec {
    /// What the workspace's guest calls it (a host name): lowercase
    /// letters, digits and `-`, at most [`MAX_SERVICE_NAME_LEN`].
    pub name: String,
    /// Its image: a registered name or an OCI reference.
    pub image: String,
    /// Its program and arguments; empty: the image's own command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Added to its command's environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The guest ports the workspace reaches it on (`name:port`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

/// What a companion serves: set on the companion's own spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Serving {
    /// The workspace it serves, by full name.
    pub workspace: String,
    /// The service's place in that workspace's list (its vsock ports).
    pub index: usize,
    /// The service's name there.
    pub service: String,
}

/// The host vsock port of service `index`'s port number `slot`.
pub fn relay_vsock_port(index: usize, slot: usize) -> u32 {
    // Both are bounded by validation (8 and 8), so this cannot overflow.
    SERVICE_VSOCK_BASE + (index * MAX_SERVICE_PORTS + slot) as u32
}

/// The loopback address service `index` has in its workspace's guest
/// (127.0.1.2 up: 127.0.1.1 is the guest's own name on Debian).
pub fn guest_addr(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1, 2 + index.min(MAX_SERVICES) as u8)
}

/// The companion's full name of service `service` of `workspace` (a full
/// name): the service's name and a digest of the workspace's, so no two
/// workspaces share one and the same workspace always finds its own.
pub fn companion_name(workspace: &str, service: &str) -> String {
    let digest = Sha256::digest(workspace.as_bytes());
    let short: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{service}-{short}.{SERVICE_NAMESPACE}")
}

/// Every port of `services` with its route: (service index, service,
/// guest port, host vsock port).
pub fn routes(services: &[ServiceSpec]) -> impl Iterator<Item = (usize, &ServiceSpec, u16, u32)> {
    services.iter().enumerate().flat_map(|(i, s)| {
        s.ports
            .iter()
            .enumerate()
            .map(move |(j, &port)| (i, s, port, relay_vsock_port(i, j)))
    })
}

fn bad<T>(why: String) -> Result<T, ServiceSpecError> {
    Err(ServiceSpecError::Invalid(why))
}

/// A service's ports: at most [`MAX_SERVICE_PORTS`], each once, none 0.
pub fn validate_service_ports(ports: &[u16]) -> Result<(), ServiceSpecError> {
    if ports.len() > MAX_SERVICE_PORTS {
        return bad(format!(
            "service ports: {} given, at most {MAX_SERVICE_PORTS}",
            ports.len()
        ));
    }
    let mut seen = BTreeSet::new();
    for &port in ports {
        if port == 0 {
            return bad("service ports: port 0 names nothing".into());
        }
        if !seen.insert(port) {
            return bad(format!("service ports: port {port} is given twice"));
        }
    }
    Ok(())
}

/// Checks a workspace's services: at most [`MAX_SERVICES`], names unique
/// host names (not `localhost`), each one's image, command and ports
/// within bounds, and at most [`MAX_SERVICE_PORTS_IN_ALL`] ports in all.
/// Their env is checked by the spec, as the workspace's own is.
pub fn validate(services: &[ServiceSpec]) -> Result<(), ServiceSpecError> {
    if services.len() > MAX_SERVICES {
        return bad(format!(
            "{} services; at most {MAX_SERVICES} are allowed",
            services.len()
        ));
    }
    let mut names = BTreeSet::new();
    for s in services {
        let named = |why: String| bad(format!("service `{}`: {why}", s.name));
        crate::store::name::validate_name(&s.name)
            .map_err(|e| ServiceSpecError::Invalid(format!("service name `{}`: {e}", s.name)))?;
        if s.name.len() > MAX_SERVICE_NAME_LEN {
            return named(format!("the name is longer than {MAX_SERVICE_NAME_LEN}"));
        }
        if s.name == "localhost" {
            return named("`localhost` is the guest's own name".into());
        }
        if !names.insert(s.name.as_str()) {
            return named("named twice".into());
        }
        if s.image.is_empty() || s.image.len() > 512 {
            return named("its image must be 1 to 512 characters".into());
        }
        if s.command.len() > MAX_COMMAND_WORDS
            || s.command.iter().any(|w| w.len() > MAX_COMMAND_WORD_BYTES)
        {
            return named(format!(
                "its command takes at most {MAX_COMMAND_WORDS} words of {MAX_COMMAND_WORD_BYTES} bytes"
            ));
        }
        validate_service_ports(&s.ports).or_else(|e| named(e.to_string()))?;
    }
    let all: usize = services.iter().map(|s| s.ports.len()).sum();
    if all > MAX_SERVICE_PORTS_IN_ALL {
        return bad(format!(
            "the services serve {all} ports; at most {MAX_SERVICE_PORTS_IN_ALL} in all"
        ));
    }
    Ok(())
}

/// Checks what a companion serves: a workspace's full name, a service's
/// name and its place in that workspace's list.
pub fn validate_serving(serving: &Serving) -> Result<(), ServiceSpecError> {
    crate::store::name::validate_full_name(&serving.workspace)
        .map_err(|e| ServiceSpecError::Invalid(format!("served workspace: {e}")))?;
    crate::store::name::validate_name(&serving.service)
        .map_err(|e| ServiceSpecError::Invalid(format!("service name: {e}")))?;
    if serving.index >= MAX_SERVICES {
        return bad(format!("a service's place is below {MAX_SERVICES}"));
    }
    Ok(())
}

/// Reads the CLI's `NAME=IMAGE[,port=P]...[,env=K=V]...[,cmd=COMMAND]`:
/// `cmd=` comes last and takes the rest of the text (commas included),
/// run by `sh -c`.
pub fn parse_flag(text: &str) -> Result<ServiceSpec, ServiceSpecError> {
    let usage = |why: &str| {
        ServiceSpecError::Invalid(format!(
            "service {text:?}: {why}; write NAME=IMAGE[,port=P][,env=K=V][,cmd=COMMAND]"
        ))
    };
    let (name, rest) = text.split_once('=').ok_or_else(|| usage("no `=`"))?;
    let (head, cmd) = match rest.find(",cmd=") {
        Some(at) => (&rest[..at], Some(&rest[at + ",cmd=".len()..])),
        None => (rest, None),
    };
    let mut parts = head.split(',');
    let image = parts.next().unwrap_or_default();
    let mut spec = ServiceSpec {
        name: name.to_owned(),
        image: image.to_owned(),
        command: cmd
            .map(|c| vec!["sh".to_owned(), "-c".to_owned(), c.to_owned()])
            .unwrap_or_default(),
        env: BTreeMap::new(),
        ports: Vec::new(),
    };
    for part in parts {
        match part.split_once('=') {
            Some(("port", p)) => spec
                .ports
                .push(p.parse().map_err(|_| usage("a port is 1 to 65535"))?),
            Some(("env", kv)) => {
                let (k, v) = kv.split_once('=').ok_or_else(|| usage("env takes K=V"))?;
                spec.env.insert(k.to_owned(), v.to_owned());
            }
            _ => return Err(usage(&format!("`{part}` is not port=, env= or cmd="))),
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, ports: &[u16]) -> ServiceSpec {
        ServiceSpec {
            name: name.into(),
            image: "redis".into(),
            command: Vec::new(),
            env: BTreeMap::new(),
            ports: ports.to_vec(),
        }
    }

    #[test]
    fn the_flag_reads_as_people_write_it() {
        let s = parse_flag("web=test-1,port=8080,env=A=b=c,cmd=httpd -f -p 8080, x").unwrap();
        assert_eq!(s.name, "web");
        assert_eq!(s.image, "test-1");
        assert_eq!(s.ports, [8080]);
        assert_eq!(s.env["A"], "b=c");
        assert_eq!(s.command, ["sh", "-c", "httpd -f -p 8080, x"]);
        let plain = parse_flag("db=docker.io/library/redis:7").unwrap();
        assert_eq!(plain.image, "docker.io/library/redis:7");
        assert!(plain.command.is_empty() && plain.ports.is_empty());
        for wrong in [
            "web",
            "web=x,port=http",
            "web=x,port=70000",
            "web=x,mode=1",
            "web=x,env=K",
        ] {
            let e = parse_flag(wrong).unwrap_err().to_string();
            assert!(e.contains("NAME=IMAGE"), "{wrong}: {e}");
        }
    }

    #[test]
    fn services_are_checked_whole() {
        assert!(validate(&[service("web", &[80]), service("db", &[5432, 5433])]).is_ok());
        let cases: Vec<(Vec<ServiceSpec>, &str)> = vec![
            (
                vec![service("web", &[80]), service("web", &[81])],
                "named twice",
            ),
            (vec![service("Web", &[80])], "service name"),
            (vec![service("localhost", &[80])], "localhost"),
            (vec![service("web", &[0])], "port 0"),
            (vec![service("web", &[80, 80])], "twice"),
            (vec![service(&"a".repeat(41), &[80])], "longer"),
            (
                (0..9).map(|i| service(&format!("s{i}"), &[])).collect(),
                "at most 8",
            ),
            (
                (0..5)
                    .map(|i| service(&format!("s{i}"), &[1, 2, 3, 4, 5, 6, 7]))
                    .collect(),
                "at most 32 in all",
            ),
        ];
        for (services, want) in cases {
            let e = validate(&services).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        let mut image = service("web", &[80]);
        image.image.clear();
        assert!(validate(&[image]).is_err());
        let mut command = service("web", &[80]);
        command.command = vec!["x".repeat(MAX_COMMAND_WORD_BYTES + 1)];
        assert!(validate(&[command]).is_err());
    }

    #[test]
    fn routes_and_names_are_stable_and_distinct() {
        let services = [service("web", &[80, 443]), service("db", &[5432])];
        let routes: Vec<_> = routes(&services)
            .map(|(i, s, port, vsock)| (i, s.name.as_str(), port, vsock))
            .collect();
        assert_eq!(
            routes,
            [
                (0, "web", 80, 50_000),
                (0, "web", 443, 50_001),
                (1, "db", 5432, 50_008)
            ]
        );
        assert_eq!(guest_addr(0), Ipv4Addr::new(127, 0, 1, 2));
        assert_eq!(guest_addr(7), Ipv4Addr::new(127, 0, 1, 9));
        let a = companion_name("dev", "web");
        assert_eq!(a, companion_name("dev", "web"));
        assert_ne!(a, companion_name("dev.other", "web"));
        assert!(a.ends_with(".microagent-svc"), "{a}");
        crate::store::name::validate_full_name(&a).unwrap();
        crate::store::name::validate_full_name(&companion_name("x.y", &"a".repeat(40))).unwrap();
    }
}
