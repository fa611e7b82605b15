//! Red-team destinations for the `user` network's filter: IPv6 spellings
//! of guarded IPv4 addresses. `Prefix::contains` holds no IPv6 address in
//! an IPv4 prefix, and `GUARDED` lists no `::ffff:0:0/96` (IPv4-mapped)
//! nor `::` (unspecified, which Linux connects to the local host), so a
//! guest sending to `::ffff:169.254.169.254` passes the filter under the
//! default `egress all`, and an allowlisted name's AAAA answer of that
//! address is admitted. passt turns the guest's IPv6 flows into host
//! sockets; a dual-stack host socket sends a mapped address as IPv4.

use std::net::IpAddr;

use super::user_filter::filter_policy;
use crate::store::egress::{AllowEntry, Egress};

#[test]
fn ipv6_spellings_of_guarded_addresses_are_guarded() {
    let all = filter_policy(Egress::All, &[]);
    for dst in [
        "::ffff:169.254.169.254",
        "::ffff:127.0.0.1",
        "::ffff:10.0.2.2",
        "::ffff:192.168.1.1",
        "::",
    ] {
        let ip: IpAddr = dst.parse().unwrap();
        assert!(
            all.decide(ip, Some(80), false).is_err(),
            "{dst} passes the filter under egress all"
        );
    }
}

#[test]
fn a_learned_ipv4_mapped_answer_never_opens_a_guarded_range() {
    let list = filter_policy(
        Egress::Allowlist,
        &[AllowEntry::Domain("rebind.test".into())],
    );
    let ip: IpAddr = "::ffff:169.254.169.254".parse().unwrap();
    assert!(
        list.decide(ip, Some(80), true).is_err(),
        "an allowlisted name's AAAA ::ffff:169.254.169.254 is admitted"
    );
}
