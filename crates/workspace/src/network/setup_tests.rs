//! Host setup plans: dnsmasq per policy, what a bare, a set-up and a
//! changed host get, and teardown.

use super::*;
use crate::network::{Egress, Subnet};

fn net(name: &str, index: u8, egress: Egress, allow: &[&str]) -> Network {
    Network {
        name: name.into(),
        builtin: false,
        backend: Some(Backend::Tap),
        subnet: Some(format!("10.89.{index}.0/24").parse::<Subnet>().unwrap()),
        egress,
        allow: allow.iter().map(|a| a.parse().unwrap()).collect(),
        index,
        created_at_ms: 1,
    }
}

fn dir() -> PathBuf {
    PathBuf::from("/state/networks")
}

const UPSTREAM: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);

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
        some.contains("--nftset=/pypi.org/a.test/4#ip#microagent#allow2"),
        "{some}"
    );
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
    assert_eq!(lines[2], "ip link del dev microagent0");
    assert_eq!(lines[3], "ip link del dev ma0t2");
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
