//! Host setup of the `tap` networks, as a [`Plan`]: per network a bridge
//! holding its gateway address and a `dnsmasq` on it (the guests'
//! resolver, which on `allowlist` networks answers only the allowed
//! domains and puts the addresses it returns into the network's nftables
//! set), IPv4 forwarding, and our nftables table ([`super::nft`]). The
//! teardown plan removes all of it. What was applied is recorded
//! ([`APPLIED_FILE`]) so `doctor` and the next preview can tell whether the
//! host matches the networks.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{nft, Backend, Egress, Network, HOST_ALIAS};
use base::host::plan::{Plan, Step};

/// The record of the last applied setup, in the networks directory.
pub const APPLIED_FILE: &str = ".host-setup.json";
/// The sysctl that lets the host route guest traffic.
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// What the host has now, as far as the plans care.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostState {
    /// Interfaces whose names start with `microagent` or `ma` + digit.
    pub links: Vec<String>,
    /// IPv4 forwarding is on.
    pub ip_forward: bool,
    /// Our table exists (false also when it cannot be listed).
    pub table: bool,
    /// Our bridge table of guest guards exists.
    pub guard_table: bool,
    /// Per network name: the pid of its running dnsmasq.
    pub dnsmasq: Vec<(String, u32)>,
    /// The digest recorded by the last apply.
    pub applied: Option<String>,
}

/// The record [`APPLIED_FILE`] holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct Applied {
    /// The digest of the desired state that was applied.
    pub digest: String,
    /// When, Unix ms.
    pub at_ms: u64,
}

/// Where a network's dnsmasq keeps its pid file and log.
pub fn dnsmasq_files(networks_dir: &Path, net: &Network) -> (PathBuf, PathBuf) {
    (
        networks_dir.join(format!("{}.dnsmasq.pid", net.name)),
        networks_dir.join(format!("{}.dnsmasq.log", net.name)),
    )
}

/// The host's IPv4 resolvers (from /etc/resolv.conf), which `allowlist`
/// networks forward their allowed domains to.
pub fn host_resolvers() -> Vec<Ipv4Addr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .map(|s| parse_resolvers(&s))
        .unwrap_or_default()
}

fn parse_resolvers(conf: &str) -> Vec<Ipv4Addr> {
    conf.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse().ok())
        .collect()
}

/// The dnsmasq command line of a `tap` network.
pub fn dnsmasq_args(
    networks_dir: &Path,
    net: &Network,
    resolvers: &[Ipv4Addr],
) -> Option<Vec<String>> {
    let (bridge, gateway) = (net.bridge()?, net.gateway()?);
    let (pid, log) = dnsmasq_files(networks_dir, net);
    let mut args = vec![
        "--conf-file=/dev/null".to_owned(),
        format!("--pid-file={}", pid.display()),
        format!("--log-facility={}", log.display()),
        format!("--interface={bridge}"),
        "--bind-interfaces".to_owned(),
        "--except-interface=lo".to_owned(),
        format!("--listen-address={gateway}"),
        "--no-hosts".to_owned(),
        format!("--address=/{HOST_ALIAS}/{gateway}"),
        // An upstream answer naming a private, loopback or link-local
        // address is dropped (DNS rebinding): a name's owner chooses its
        // answers, and only a CIDR rule may open those ranges.
        "--stop-dns-rebind".to_owned(),
    ];
    // dnsmasq reads `*.d` as the names under d, `d` as d and those.
    let domains: Vec<String> = net
        .allow
        .iter()
        .filter_map(|a| match a {
            super::AllowEntry::Domain(d) => Some(d.clone()),
            super::AllowEntry::Subdomains(d) => Some(format!("*.{d}")),
            _ => None,
        })
        .collect();
    match net.egress {
        // Every name, through the host's resolv.conf.
        Egress::All => {}
        // Only the host's alias: a query for anything else is refused (no
        // data leaves through DNS either).
        Egress::None => args.push("--no-resolv".into()),
        Egress::Allowlist => {
            args.push("--no-resolv".into());
            for d in &domains {
                for r in resolvers {
                    args.push(format!("--server=/{d}/{r}"));
                }
            }
            if !domains.is_empty() {
                args.push(format!(
                    "--nftset=/{}/4#ip#{}#{}",
                    domains.join("/"),
                    nft::TABLE,
                    nft::resolved_set(net)
                ));
                // Answers never outlive the addresses they admitted.
                let cap = nft::ANSWER_TTL_CAP_SECONDS;
                args.push(format!("--max-ttl={cap}"));
                args.push(format!("--max-cache-ttl={cap}"));
            }
        }
    }
    Some(args)
}

/// What the host should have for `networks`, and its digest.
#[derive(Clone, Debug)]
pub struct Desired {
    /// The `tap` networks.
    pub taps: Vec<Network>,
    /// Our nftables ruleset.
    pub ruleset: String,
    /// Per network: its dnsmasq's arguments.
    pub dnsmasq: Vec<(Network, Vec<String>)>,
}

impl Desired {
    /// The desired state of `networks`.
    pub fn of(networks: &[Network], networks_dir: &Path, resolvers: &[Ipv4Addr]) -> Self {
        let taps: Vec<Network> = networks
            .iter()
            .filter(|n| n.backend == Some(Backend::Tap))
            .cloned()
            .collect();
        let dnsmasq = taps
            .iter()
            .filter_map(|n| Some((n.clone(), dnsmasq_args(networks_dir, n, resolvers)?)))
            .collect();
        Self {
            ruleset: nft::ruleset(&taps),
            taps,
            dnsmasq,
        }
    }

    /// The digest the applied record keeps.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(&self.ruleset);
        for (net, args) in &self.dnsmasq {
            h.update(&net.name);
            h.update(args.join("\0"));
            h.update(net.subnet.map(|s| s.to_string()).unwrap_or_default());
        }
        format!("{:x}", h.finalize())
    }

    /// Whether the host has all of it.
    pub fn is_applied(&self, host: &HostState) -> bool {
        host.applied.as_deref() == Some(self.digest().as_str())
            && (self.taps.is_empty() || (host.table && host.ip_forward))
            && self
                .taps
                .iter()
                .all(|n| n.bridge().is_some_and(|b| host.links.contains(&b)))
            && self
                .dnsmasq
                .iter()
                .all(|(n, _)| host.dnsmasq.iter().any(|(name, _)| *name == n.name))
    }
}

fn is_ours(link: &str) -> bool {
    link.strip_prefix("microagent")
        .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        || link
            .strip_prefix("ma")
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()) && r.contains('t'))
}

fn stop_dnsmasq(pid: u32, network: &str) -> Step {
    Step::new(
        format!("stop network `{network}`'s dnsmasq (pid {pid})"),
        "sh",
        &[
            "-c",
            &format!(
                "kill {pid} 2>/dev/null; while kill -0 {pid} 2>/dev/null; do sleep 0.05; done"
            ),
        ],
    )
}

/// The plan that makes the host match `want` (empty when it does).
pub fn setup_plan(want: &Desired, host: &HostState) -> Plan {
    let mut plan = Plan::new("network setup");
    if want.is_applied(host) {
        plan.notes
            .push("the host already matches the networks".into());
        return plan;
    }
    let s = &mut plan.steps;
    let wanted: Vec<String> = want.taps.iter().filter_map(Network::bridge).collect();
    // Old dnsmasqs go first: a new one binds the same address.
    for (name, pid) in &host.dnsmasq {
        s.push(stop_dnsmasq(*pid, name));
    }
    for link in host
        .links
        .iter()
        .filter(|l| l.starts_with("microagent") && is_ours(l) && !wanted.contains(l))
    {
        s.push(Step::new(
            format!("remove bridge {link} (no network has it now)"),
            "ip",
            &["link", "del", "dev", link],
        ));
    }
    for net in &want.taps {
        let (Some(br), Some(gw), Some(subnet)) = (net.bridge(), net.gateway(), net.subnet) else {
            continue;
        };
        if !host.links.contains(&br) {
            s.push(Step::new(
                format!("add bridge {br} for network `{}`", net.name),
                "ip",
                &["link", "add", "name", &br, "type", "bridge"],
            ));
        }
        s.push(Step::new(
            format!("give {br} the gateway address of `{}`", net.name),
            "ip",
            &[
                "addr",
                "replace",
                &format!("{gw}/{}", subnet.prefix),
                "dev",
                &br,
            ],
        ));
        s.push(Step::new(
            format!("bring {br} up"),
            "ip",
            &["link", "set", "dev", &br, "up"],
        ));
    }
    if !want.taps.is_empty() && !host.ip_forward {
        s.push(Step::new(
            "let the host route guest traffic (IPv4 forwarding)",
            "sysctl",
            &["-w", "net.ipv4.ip_forward=1"],
        ));
    }
    s.push(
        Step::new(
            format!(
                "replace nftables table ip {} (NAT and egress rules)",
                nft::TABLE
            ),
            "nft",
            &["-f", "-"],
        )
        .with_stdin(want.ruleset.clone()),
    );
    for (net, args) in &want.dnsmasq {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        s.push(Step::new(
            format!("start network `{}`'s resolver", net.name),
            "dnsmasq",
            &args,
        ));
    }
    plan.notes.push(
        "the rules live in our own table; another table's DROP policy (Docker's, a firewall's) still applies to guest traffic"
            .into(),
    );
    plan.needs_root = !plan.steps.is_empty();
    plan
}

/// The plan that removes everything setup made.
pub fn teardown_plan(host: &HostState) -> Plan {
    let mut plan = Plan {
        notes: vec!["IPv4 forwarding is left as it is (other software may rely on it)".into()],
        ..Plan::new("network teardown")
    };
    for (name, pid) in &host.dnsmasq {
        plan.steps.push(stop_dnsmasq(*pid, name));
    }
    if host.table {
        plan.steps.push(Step::new(
            format!("delete nftables table ip {}", nft::TABLE),
            "nft",
            &["delete", "table", "ip", nft::TABLE],
        ));
    }
    if host.guard_table {
        plan.steps.push(Step::new(
            format!("delete nftables table bridge {}", nft::GUARD_TABLE),
            "nft",
            &["delete", "table", "bridge", nft::GUARD_TABLE],
        ));
    }
    for link in host.links.iter().filter(|l| is_ours(l)) {
        plan.steps.push(Step::new(
            format!("remove {link}"),
            "ip",
            &["link", "del", "dev", link],
        ));
    }
    plan.needs_root = !plan.steps.is_empty();
    plan
}

/// Reads what the host has: links, forwarding, our table, the running
/// dnsmasqs (by their pid files) and the applied record.
pub fn probe(networks_dir: &Path) -> HostState {
    let links = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .map(|o| parse_links(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default();
    let listed = |family: &str, table: &str| {
        Command::new("nft")
            .args(["list", "table", family, table])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let (table, guard_table) = (listed("ip", nft::TABLE), listed("bridge", nft::GUARD_TABLE));
    let ip_forward = std::fs::read_to_string(IP_FORWARD).is_ok_and(|v| v.trim() == "1");
    // Every pid file, so the resolver of a removed network is found too.
    let mut dnsmasq: Vec<(String, u32)> = std::fs::read_dir(networks_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let file = e.file_name().to_str()?.to_owned();
            let name = file.strip_suffix(".dnsmasq.pid")?.to_owned();
            let pid_file = e.path();
            let pid: u32 = std::fs::read_to_string(&pid_file)
                .ok()?
                .trim()
                .parse()
                .ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let ours = String::from_utf8_lossy(&cmdline).contains(&*pid_file.to_string_lossy());
            ours.then_some((name, pid))
        })
        .collect();
    dnsmasq.sort();
    let applied = base::store::read_json::<Applied>(&networks_dir.join(APPLIED_FILE))
        .ok()
        .map(|a| a.digest);
    HostState {
        links,
        ip_forward,
        table,
        guard_table,
        dnsmasq,
        applied,
    }
}

/// Names of our interfaces in `ip -o link show` output.
fn parse_links(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or("").to_owned())
        .filter(|n| is_ours(n))
        .collect()
}

/// A host setup or teardown: the plan, its token, and whether it was
/// applied (only with a valid token).
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct HostChange {
    /// The plan and its token.
    #[serde(flatten)]
    pub preview: base::host::plan::Preview,
    /// The plan was applied (false: a preview).
    pub applied: bool,
}

#[cfg(test)]
mod tests {
    // Host setup plans: dnsmasq per policy, what a bare, a set-up and a
    // changed host get, and teardown.

    use super::*;
    use base::network::{Egress, Subnet};

    fn net(name: &str, index: u8, egress: Egress, allow: &[&str]) -> Network {
        Network {
            name: name.into(),
            builtin: false,
            backend: Some(Backend::Tap),
            subnet: Some(format!("10.89.{index}.0/24").parse::<Subnet>().unwrap()),
            egress,
            allow: allow.iter().map(|a| a.parse().unwrap()).collect(),
            allow_peers: false,
            index,
            created_at_ms: 1,
        }
    }

    fn dir() -> PathBuf {
        PathBuf::from("/state/networks")
    }

    const UPSTREAM: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);

    #[test]
    fn upstream_answers_naming_guarded_ranges_are_dropped_in_every_mode() {
        // An allowlisted name's owner chooses its answers (DNS rebinding):
        // dnsmasq drops private, loopback and link-local ones, and no
        // exception for a domain or for localhost is made.
        for (i, egress) in [Egress::All, Egress::None, Egress::Allowlist]
            .into_iter()
            .enumerate()
        {
            let n = net("rebind", i as u8, egress, &["attacker.test"]);
            let args = dnsmasq_args(&dir(), &n, &[UPSTREAM]).unwrap();
            assert!(args.iter().any(|a| a == "--stop-dns-rebind"), "{args:?}");
            assert!(!args.iter().any(|a| a.starts_with("--rebind-")), "{args:?}");
        }
    }

    #[test]
    fn resolvers_follow_the_policy() {
        let args = |n: &Network| dnsmasq_args(&dir(), n, &[UPSTREAM]).unwrap().join(" ");
        let all = args(&net("open", 0, Egress::All, &[]));
        assert!(all.contains("--listen-address=10.89.0.1"), "{all}");
        assert!(all.contains("--address=/host.microagent.internal/10.89.0.1"));
        assert!(all.contains("--pid-file=/state/networks/open.dnsmasq.pid"));
        assert!(!all.contains("--no-resolv"), "{all}");
        let none = args(&net("shut", 1, Egress::None, &[]));
        assert!(
            none.contains("--no-resolv") && !none.contains("--server"),
            "{none}"
        );
        let some = args(&net(
            "some",
            2,
            Egress::Allowlist,
            &["pypi.org", "a.test", "10.0.0.0/8"],
        ));
        assert!(some.contains("--no-resolv"), "{some}");
        assert!(some.contains("--server=/pypi.org/192.0.2.53"), "{some}");
        assert!(some.contains("--server=/a.test/192.0.2.53"), "{some}");
        assert!(
            some.contains("--nftset=/pypi.org/a.test/4#ip#microagent#resolved2"),
            "{some}"
        );
        assert!(some.contains("--max-ttl=1800"), "{some}");
        assert!(some.contains("--max-cache-ttl=1800"), "{some}");
        assert!(!some.contains("10.0.0.0"), "CIDRs go to the ruleset");
        assert_eq!(dnsmasq_args(&dir(), &Network::user(), &[UPSTREAM]), None);
    }

    #[test]
    fn a_bare_host_gets_everything_in_order() {
        let want = Desired::of(&[net("open", 0, Egress::All, &[])], &dir(), &[UPSTREAM]);
        let plan = setup_plan(&want, &HostState::default());
        let lines: Vec<String> = plan.steps.iter().map(|s| s.command_line()).collect();
        assert_eq!(lines[0], "ip link add name microagent0 type bridge");
        assert_eq!(lines[1], "ip addr replace 10.89.0.1/24 dev microagent0");
        assert_eq!(lines[2], "ip link set dev microagent0 up");
        assert_eq!(lines[3], "sysctl -w net.ipv4.ip_forward=1");
        assert_eq!(lines[4], "nft -f -");
        assert_eq!(plan.steps[4].stdin.as_deref(), Some(want.ruleset.as_str()));
        assert!(
            lines[5].starts_with("dnsmasq --conf-file=/dev/null"),
            "{}",
            lines[5]
        );
        assert_eq!(lines.len(), 6);
    }

    #[test]
    fn an_applied_host_needs_nothing_and_a_changed_one_is_redone() {
        let nets = [net("open", 0, Egress::All, &[])];
        let want = Desired::of(&nets, &dir(), &[UPSTREAM]);
        let host = HostState {
            links: vec!["microagent0".into(), "ma0t2".into()],
            ip_forward: true,
            table: true,
            guard_table: false,
            dnsmasq: vec![("open".into(), 4242)],
            applied: Some(want.digest()),
        };
        assert!(setup_plan(&want, &host).steps.is_empty());
        // A second network: the old resolver stops first, the bridge is kept.
        let more = [nets[0].clone(), net("shut", 1, Egress::None, &[])];
        let want2 = Desired::of(&more, &dir(), &[UPSTREAM]);
        let plan = setup_plan(&want2, &host);
        let lines: Vec<String> = plan.steps.iter().map(|s| s.command_line()).collect();
        assert!(lines[0].contains("kill 4242"), "{lines:?}");
        assert!(!lines
            .iter()
            .any(|l| l == "ip link add name microagent0 type bridge"));
        assert!(lines
            .iter()
            .any(|l| l == "ip link add name microagent1 type bridge"));
        assert!(!lines.iter().any(|l| l.starts_with("sysctl")));
        assert_eq!(lines.iter().filter(|l| l.starts_with("dnsmasq")).count(), 2);
        // A bridge no network has any more goes.
        let fewer = Desired::of(&[], &dir(), &[UPSTREAM]);
        let plan = setup_plan(&fewer, &host);
        let lines: Vec<String> = plan.steps.iter().map(|s| s.command_line()).collect();
        assert!(
            lines.contains(&"ip link del dev microagent0".to_owned()),
            "{lines:?}"
        );
    }

    #[test]
    fn teardown_removes_what_setup_made() {
        let host = HostState {
            links: vec!["microagent0".into(), "ma0t2".into()],
            ip_forward: true,
            table: true,
            guard_table: true,
            dnsmasq: vec![("open".into(), 4242)],
            applied: Some("x".into()),
        };
        let lines: Vec<String> = teardown_plan(&host)
            .steps
            .iter()
            .map(|s| s.command_line())
            .collect();
        assert!(lines[0].contains("kill 4242"));
        assert_eq!(lines[1], "nft delete table ip microagent");
        assert_eq!(lines[2], "nft delete table bridge microagent_guard");
        assert_eq!(lines[3], "ip link del dev microagent0");
        assert_eq!(lines[4], "ip link del dev ma0t2");
        assert!(teardown_plan(&HostState::default()).steps.is_empty());
    }

    #[test]
    fn host_facts_parse() {
        assert_eq!(
            parse_resolvers(
                "# x\nnameserver 10.0.0.53\nnameserver ::1\nsearch a\n nameserver 192.0.2.1\n"
            ),
            [Ipv4Addr::new(10, 0, 0, 53), Ipv4Addr::new(192, 0, 2, 1)]
        );
        let links = "1: lo: <LOOPBACK> mtu 65536\n5: microagent0: <BROADCAST> mtu 1500\n6: ma0t2: <BROADCAST> mtu 1500 master microagent0\n7: eth0@if8: <UP>\n8: microagentx: <UP>\n9: mango: <UP>\n";
        assert_eq!(parse_links(links), ["microagent0", "ma0t2"]);
    }
}
