//! Egress rules that open the host's side of the network (host ports,
//! loopback, the metadata address, private ranges, anything wider than one
//! address), and a tap network under egress all, are FORBIDDEN over MCP
//! unless the server was started with `--allow-host-egress`, and a refusal
//! changes nothing. No KVM needed.

mod common;

use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_opening_the_host_need_the_servers_grant() {
    let h = common::McpHarness::new("egress-grants").await;
    h.fake_image("fake");
    h.ok(
        "workspace_create",
        json!({"name": "dev", "image": "fake", "allow": ["pypi.org", "93.184.216.34/32:443"]}),
    )
    .await;
    let before = h.snapshot();
    for rule in [
        "host:6379",
        "169.254.169.254/32",
        "127.0.0.1/32:6379",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "224.0.0.251/32",
        "0.0.0.0/0",
    ] {
        let message = h
            .fails(
                "workspace_create",
                json!({"name": "evil", "image": "fake", "allow": [rule]}),
                "FORBIDDEN",
            )
            .await;
        assert!(message.contains("--allow-host-egress"), "{message}");
        h.fails(
            "workspace_set_egress",
            json!({"workspace": "dev", "allow": ["pypi.org", rule]}),
            "FORBIDDEN",
        )
        .await;
        h.fails(
            "run",
            json!({"command": ["true"], "image": "fake", "allow": [rule]}),
            "FORBIDDEN",
        )
        .await;
        h.fails(
            "network_create",
            json!({"name": "corp", "backend": "tap", "egress": "allowlist", "allow": [rule]}),
            "FORBIDDEN",
        )
        .await;
    }
    assert!(h.snapshot() == before, "refused calls changed nothing");
    let contract = h.ok("contract", json!({})).await;
    let grant = contract["grants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["flag"] == "--allow-host-egress")
        .cloned()
        .unwrap();
    assert_eq!(grant["granted"], false);
    h.finish().await;

    let granted = mcp::Grants::default().host_egress(true);
    let h = common::McpHarness::with_grants("egress-granted", granted).await;
    h.fake_image("fake");
    let made = h
        .ok(
            "workspace_create",
            json!({"name": "dev", "image": "fake", "allow": ["host:6379", "169.254.169.254/32"]}),
        )
        .await;
    assert_eq!(
        made["spec"]["allow"],
        json!(["host:6379", "169.254.169.254/32"])
    );
    let set = h
        .ok(
            "workspace_set_egress",
            json!({"workspace": "dev", "allow": ["10.0.0.0/8"]}),
        )
        .await;
    assert_eq!(set["allow"], json!(["10.0.0.0/8"]));
    let contract = h.ok("contract", json!({})).await;
    assert!(contract["grants"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["flag"] == "--allow-host-egress" && g["granted"] == true));
    h.finish().await;
}

/// A `tap` network under egress `all` (the default) reaches the host
/// itself, the metadata address and the LAN with no rule at all: over MCP
/// it needs the grant too (red team).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_network_that_reaches_the_host_needs_the_servers_grant() {
    let h = common::McpHarness::new("egress-grants-tap").await;
    let before = h.snapshot();
    for params in [
        json!({"name": "wide", "backend": "tap"}),
        json!({"name": "wide", "backend": "tap", "egress": "all"}),
    ] {
        let message = h.fails("network_create", params, "FORBIDDEN").await;
        assert!(message.contains("--allow-host-egress"), "{message}");
    }
    assert!(h.snapshot() == before, "refused calls changed nothing");
    h.finish().await;
}
