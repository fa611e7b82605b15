//! Network records: parsing, validation, creation and removal rules.

use super::*;

fn temp_state() -> (StateDir, PathBuf) {
    let root = std::env::temp_dir().join(format!(
        "ma-networks-{}",
        crate::host::settings::unique_id()
    ));
    (StateDir::at(&root).unwrap(), root)
}

fn tap(egress: Egress, allow: &[&str]) -> NetworkRequest {
    NetworkRequest {
        backend: Backend::Tap,
        subnet: None,
        egress,
        allow: allow.iter().map(|a| a.parse().unwrap()).collect(),
    }
}

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

#[test]
fn requests_are_checked_before_anything_is_written() {
    let user_none = NetworkRequest {
        egress: Egress::None,
        ..NetworkRequest::default()
    };
    let err = validate_request(&user_none).unwrap_err().to_string();
    assert!(err.contains("needs a tap network"), "{err}");
    assert!(validate_request(&tap(Egress::Allowlist, &[])).is_err());
    assert!(validate_request(&tap(Egress::All, &["pypi.org"])).is_err());
    validate_request(&tap(Egress::Allowlist, &["pypi.org", "10.0.0.0/8"])).unwrap();
    let public = NetworkRequest {
        subnet: Some("8.8.8.0/24".parse().unwrap()),
        ..NetworkRequest::default()
    };
    assert!(validate_request(&public)
        .unwrap_err()
        .to_string()
        .contains("not private"));
    let tiny = NetworkRequest {
        subnet: Some("10.1.1.0/30".parse().unwrap()),
        ..NetworkRequest::default()
    };
    assert!(validate_request(&tiny).is_err());
}

#[test]
fn builtins_are_listed_and_cannot_be_made_or_removed() {
    let (state, root) = temp_state();
    let nets = Networks::new(&state);
    let names: Vec<String> = nets.list().unwrap().into_iter().map(|n| n.name).collect();
    assert_eq!(names, ["user", "none"]);
    assert!(matches!(
        nets.create("user", &NetworkRequest::default(), 1),
        Err(NetworkError::Exists(_))
    ));
    assert!(matches!(
        nets.remove("none", vec![]),
        Err(NetworkError::BuiltIn(_))
    ));
    assert!(matches!(nets.get("corp"), Err(NetworkError::NotFound(_))));
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn tap_networks_get_their_own_index_and_subnet() {
    let (state, root) = temp_state();
    let nets = Networks::new(&state);
    let a = nets.create("a", &tap(Egress::All, &[]), 1).unwrap();
    let b = nets.create("b", &tap(Egress::None, &[]), 2).unwrap();
    assert_eq!((a.index, b.index), (0, 1));
    assert_eq!(a.subnet.unwrap().to_string(), "10.89.0.0/24");
    assert_eq!(b.subnet.unwrap().to_string(), "10.89.1.0/24");
    assert_eq!(a.bridge().as_deref(), Some("microagent0"));
    let addr = b.addressing(5).unwrap();
    assert_eq!(addr.guest, Ipv4Addr::new(10, 89, 1, 5));
    assert_eq!(addr.gateway, Ipv4Addr::new(10, 89, 1, 1));
    assert_eq!(addr.dns, addr.gateway);
    let clash = NetworkRequest {
        subnet: Some("10.89.0.0/16".parse().unwrap()),
        ..tap(Egress::All, &[])
    };
    let err = nets.create("c", &clash, 3).unwrap_err().to_string();
    assert!(err.contains("overlaps network `a`"), "{err}");
    assert!(!root.join(NETWORKS_DIR).join("c.json").exists());
    // User networks may repeat a subnet: each guest has its own passt.
    nets.create("u1", &NetworkRequest::default(), 4).unwrap();
    nets.create("u2", &NetworkRequest::default(), 5).unwrap();
    assert_eq!(nets.get("b").unwrap(), b);
    let names: Vec<String> = nets.list().unwrap().into_iter().map(|n| n.name).collect();
    assert_eq!(names, ["user", "none", "a", "b", "u1", "u2"]);
    // An index freed by a removal is taken again.
    nets.remove("a", vec![]).unwrap();
    assert_eq!(
        nets.create("d", &tap(Egress::All, &[]), 6).unwrap().index,
        0
    );
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn a_network_in_use_is_not_removed() {
    let (state, root) = temp_state();
    let nets = Networks::new(&state);
    nets.create("corp", &tap(Egress::All, &[]), 1).unwrap();
    let err = nets.remove("corp", vec!["dev".into()]).unwrap_err();
    assert!(matches!(err, NetworkError::InUse { .. }));
    assert!(err.to_string().contains("dev"), "{err}");
    assert!(nets.get("corp").is_ok());
    let _ = std::fs::remove_dir_all(root);
}

#[test]
fn the_user_network_keeps_qemus_addresses() {
    let addr = Network::user().addressing(0).unwrap();
    assert_eq!(addr.guest, Ipv4Addr::new(10, 0, 2, 15));
    assert_eq!(addr.gateway, Ipv4Addr::new(10, 0, 2, 2));
    assert_eq!(addr.dns, Ipv4Addr::new(10, 0, 2, 3));
    assert_eq!(Network::none().addressing(0), None);
}
