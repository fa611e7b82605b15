//! What a workspace's VMM process attaches for its network: a `passt` on a
//! socket pair (`user`), or the workspace's TAP device on its network's
//! bridge (`tap`), and the addresses the guest takes.

use std::net::Ipv4Addr;
use std::process::Command;

use std::sync::{Arc, Mutex};

use vmm_core::devices::virtio::net::egress::EgressFilter;
use vmm_core::machine::NetBackendConfig;

use super::{
    Addressing, Backend, Network, NetworkError, Passt, PasstAhead, PasstSetting, PASST_LOG,
};
use crate::store::egress::{AllowEntry, Egress};
use crate::store::spec::WorkspaceSpec;
use crate::store::workspace_dir::WorkspaceDir;
use crate::store::StateDir;

/// A workspace's network device, ready for the machine.
#[derive(Debug)]
pub struct Attachment {
    /// The device's backend.
    pub backend: NetBackendConfig,
    /// The guest's addresses.
    pub addressing: Addressing,
    /// The `passt` behind a `user` network, ended with the run.
    pub passt: Option<Passt>,
    /// Whether that passt is the one a standby started ahead (else it was
    /// started now).
    pub passt_ahead: bool,
    /// The egress filter of a `user` network (nftables enforce a `tap`
    /// network's), for policy changes and refusals while it runs.
    pub egress: Option<UserEgress>,
}

/// A `user` network's egress filter, as its VMM keeps it.
#[derive(Debug)]
pub struct UserEgress {
    /// The filter the network device sends and receives through.
    pub filter: Arc<Mutex<EgressFilter>>,
    /// passt maps the gateway to the host's loopback (a `host:PORT` rule
    /// was there at the start); without it no host port can be opened
    /// until the workspace starts again.
    pub maps_host: bool,
}

/// The egress mode and rules in force for `spec` on `net`: the
/// workspace's mode if it names one, the network's otherwise; the
/// network's rules and the workspace's.
pub fn policy(net: &Network, spec: &WorkspaceSpec) -> (Egress, Vec<AllowEntry>) {
    let mut rules = net.allow.clone();
    rules.extend(
        spec.allow
            .iter()
            .filter(|r| !net.allow.contains(r))
            .cloned(),
    );
    (spec.egress.unwrap_or(net.egress), rules)
}

/// The TAP device of the guest at `guest` on a `tap` network: named by
/// the network's index and the address's offset in the subnet, so it is
/// the same at every start and unique on the host.
pub fn tap_name(net: &Network, guest: Ipv4Addr) -> Option<String> {
    let subnet = net.subnet?;
    (net.backend == Some(Backend::Tap)).then(|| {
        format!(
            "ma{}t{}",
            net.index,
            u32::from(guest) - u32::from(subnet.addr)
        )
    })
}

/// The addresses `spec`'s guest takes on `net` (`None`: no network).
pub fn addressing(net: &Network, spec: &WorkspaceSpec) -> Option<Addressing> {
    match net.backend? {
        Backend::User => net.addressing(0),
        Backend::Tap => {
            let subnet = net.subnet?;
            let guest = spec.address?;
            net.addressing(u32::from(guest) - u32::from(subnet.addr))
        }
    }
}

/// Resolves the workspace's network and attaches to it (`None`: the
/// `none` network). A `user` network's passt runs as `run_as` (uid, gid)
/// when given: the account the VMM changes to, which must still be able to
/// end it. `ahead`, a passt a standby started, serves when it was started
/// as this workspace's would be; else it ends and another starts.
pub fn attach(
    state: &StateDir,
    ws: &WorkspaceDir,
    spec: &WorkspaceSpec,
    run_as: Option<(u32, u32)>,
    ahead: Option<PasstAhead>,
) -> Result<Option<Attachment>, NetworkError> {
    let net = super::NetworkStore::new(state).get(&spec.network)?;
    let Some(addressing) = addressing(&net, spec) else {
        return Ok(None);
    };
    match net.backend {
        Some(Backend::Tap) => {
            let tap = tap_name(&net, addressing.guest).unwrap_or_default();
            let bridge = net.bridge().unwrap_or_default();
            ensure_tap(&tap, &bridge, &net.name, net.allow_peers)?;
            // Its frames carry its own MAC and address, or go nowhere.
            let guard = super::nft::guard_script(&tap, super::mac_for(ws.name()), addressing.guest);
            nft(&guard).map_err(|why| NetworkError::Tap {
                tap: tap.clone(),
                network: net.name.clone(),
                why,
            })?;
            Ok(Some(Attachment {
                backend: NetBackendConfig::Tap(tap),
                addressing,
                passt: None,
                passt_ahead: false,
                egress: None,
            }))
        }
        _ => {
            let (egress, rules) = policy(&net, spec);
            let filter = Arc::new(Mutex::new(EgressFilter::new(
                super::user_filter::filter_policy(egress, &rules),
            )));
            let setting = passt_setting(addressing, &rules, run_as);
            let log = ws.path().join(PASST_LOG);
            let (sock, passt, passt_ahead) = match ahead.and_then(|a| a.take(&log, &setting)) {
                Some((sock, passt)) => {
                    tracing::info!("passt: the one started ahead");
                    (sock, passt, true)
                }
                None => {
                    let (sock, passt) = super::start_passt(&log, &setting)?;
                    (sock, passt, false)
                }
            };
            Ok(Some(Attachment {
                backend: NetBackendConfig::Filtered(
                    Box::new(NetBackendConfig::Stream(sock)),
                    filter.clone(),
                ),
                addressing,
                passt: Some(passt),
                passt_ahead,
                egress: Some(UserEgress {
                    filter,
                    maps_host: setting.map_host,
                }),
            }))
        }
    }
}

/// The passt `spec`'s guest is given (`None`: its network has none),
/// for a standby to start ahead for a workspace like it.
pub fn passt_for(
    state: &StateDir,
    spec: &WorkspaceSpec,
    run_as: Option<(u32, u32)>,
) -> Result<Option<PasstSetting>, NetworkError> {
    let net = super::NetworkStore::new(state).get(&spec.network)?;
    Ok(user_passt(&net, spec, run_as))
}

/// The passt of `spec`'s guest on `net`, a `user` network.
fn user_passt(
    net: &Network,
    spec: &WorkspaceSpec,
    run_as: Option<(u32, u32)>,
) -> Option<PasstSetting> {
    if net.backend != Some(Backend::User) {
        return None;
    }
    let (_, rules) = policy(net, spec);
    Some(passt_setting(addressing(net, spec)?, &rules, run_as))
}

/// passt for a guest at `addressing` under the egress `rules`: the gateway
/// maps to the host's loopback only where a rule opens a host port.
fn passt_setting(
    addressing: Addressing,
    rules: &[AllowEntry],
    run_as: Option<(u32, u32)>,
) -> PasstSetting {
    PasstSetting {
        addressing,
        map_host: super::user_filter::maps_host(rules),
        run_as,
    }
}

/// Checks before a start what the VMM process would find missing: the
/// network, and a `tap` network's bridge.
pub fn preflight(state: &StateDir, spec: &WorkspaceSpec) -> Result<(), NetworkError> {
    let net = super::NetworkStore::new(state).get(&spec.network)?;
    let Some(bridge) = net.bridge() else {
        return Ok(());
    };
    if ip(&["link", "show", "dev", &bridge])?.status.success() {
        Ok(())
    } else {
        Err(NetworkError::NotSetUp {
            network: net.name,
            bridge,
        })
    }
}

fn ip(args: &[&str]) -> Result<std::process::Output, NetworkError> {
    let ip = crate::host::settings::host_tool("ip").unwrap_or_else(|| "ip".into());
    Command::new(&ip)
        .args(args)
        .output()
        .map_err(|source| NetworkError::Command {
            program: ip.display().to_string(),
            source,
        })
}

/// Makes the TAP device `tap` (persistent, so it outlives one VMM and is
/// reused at the next start) and puts it up on `bridge`, its port isolated
/// (no frame to another isolated port: guests of one network do not reach
/// each other) unless the network allows peers.
fn ensure_tap(
    tap: &str,
    bridge: &str,
    network: &str,
    allow_peers: bool,
) -> Result<(), NetworkError> {
    let bridge_there = ip(&["link", "show", "dev", bridge])?.status.success();
    if !bridge_there {
        return Err(NetworkError::NotSetUp {
            network: network.to_owned(),
            bridge: bridge.to_owned(),
        });
    }
    let exists = ip(&["link", "show", "dev", tap])?.status.success();
    let steps: Vec<Vec<&str>> = [
        (!exists).then(|| vec!["tuntap", "add", "dev", tap, "mode", "tap", "vnet_hdr"]),
        Some(vec!["link", "set", "dev", tap, "master", bridge, "up"]),
        Some(vec![
            "link",
            "set",
            "dev",
            tap,
            "type",
            "bridge_slave",
            "isolated",
            if allow_peers { "off" } else { "on" },
        ]),
    ]
    .into_iter()
    .flatten()
    .collect();
    for args in steps {
        let out = ip(&args)?;
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            let why = if said.contains("Operation not permitted") {
                "it needs CAP_NET_ADMIN: workspaces of tap networks start as root".to_owned()
            } else {
                format!("`ip {}`: {said}", args.join(" "))
            };
            return Err(NetworkError::Tap {
                tap: tap.to_owned(),
                network: network.to_owned(),
                why,
            });
        }
    }
    Ok(())
}

/// Removes a workspace's TAP device, if it has one (at delete).
pub fn remove_tap(state: &StateDir, spec: &WorkspaceSpec) {
    let Ok(net) = super::NetworkStore::new(state).get(&spec.network) else {
        return;
    };
    if let Some(tap) = spec.address.and_then(|a| tap_name(&net, a)) {
        let _ = ip(&["link", "del", "dev", &tap]);
        let _ = nft(&super::nft::unguard_script(&tap));
    }
}

/// Applies an `nft -f` script; why not.
fn nft(script: &str) -> Result<(), String> {
    use std::io::Write;
    let nft = crate::host::settings::host_tool("nft").unwrap_or_else(|| "nft".into());
    let mut child = Command::new(&nft)
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {}: {e}", nft.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("writing to nft: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft refused the guest's guard: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The lowest free guest address on a `tap` network, given the addresses
/// its workspaces hold.
pub fn free_address(net: &Network, taken: &[Ipv4Addr]) -> Result<Ipv4Addr, NetworkError> {
    let subnet = net
        .subnet
        .ok_or_else(|| NetworkError::Invalid(format!("network `{}` has no subnet", net.name)))?;
    (super::objects::TAP_FIRST_GUEST_HOST..subnet.size() - 1)
        .map(|h| subnet.host(h))
        .find(|a| !taken.contains(a))
        .ok_or_else(|| {
            NetworkError::Invalid(format!(
                "network `{}` ({subnet}) has no free address; delete a workspace on it or create a network with a larger --subnet",
                net.name
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::{Egress, Subnet};

    fn tap_net() -> Network {
        Network {
            name: "corp".into(),
            builtin: false,
            backend: Some(Backend::Tap),
            subnet: Some("10.89.7.0/28".parse::<Subnet>().unwrap()),
            egress: Egress::All,
            allow: vec![],
            allow_peers: false,
            index: 7,
            created_at_ms: 1,
        }
    }

    #[test]
    fn tap_guests_get_the_lowest_free_address_and_a_stable_device() {
        let net = tap_net();
        let a = free_address(&net, &[]).unwrap();
        assert_eq!(a, Ipv4Addr::new(10, 89, 7, 2));
        let b = free_address(&net, &[a]).unwrap();
        assert_eq!(b, Ipv4Addr::new(10, 89, 7, 3));
        assert_eq!(tap_name(&net, b).as_deref(), Some("ma7t3"));
        let all: Vec<Ipv4Addr> = (2..15).map(|h| Ipv4Addr::new(10, 89, 7, h)).collect();
        let err = free_address(&net, &all).unwrap_err().to_string();
        assert!(err.contains("no free address"), "{err}");
        let spec = WorkspaceSpec {
            network: "corp".into(),
            address: Some(b),
            ..WorkspaceSpec::default()
        };
        let addr = addressing(&net, &spec).unwrap();
        assert_eq!(addr.guest, b);
        assert_eq!(addr.gateway, Ipv4Addr::new(10, 89, 7, 1));
        assert_eq!(addr.prefix, 28);
        assert_eq!(tap_name(&Network::user(), b), None);
    }
}
