//! `agent_register` through a real MCP client, in process, without KVM:
//! a registration whose start fails (this harness has no VMM) leaves
//! neither its workspace nor its record, and the session registers again;
//! a registered session's second registration is CONFLICT.

mod common;

use common::McpHarness;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_whose_start_fails_leaves_nothing() {
    let h = McpHarness::new("agents").await;
    h.fake_image("fake");
    let failed = h
        .try_call("agent_register", json!({"name": "alpha", "image": "fake"}))
        .await
        .unwrap();
    assert_eq!(failed.is_error, Some(true), "the start cannot succeed here");
    let every = json!({"namespace": "*", "all_agents": true});
    let listed = h.ok("workspace_list", every.clone()).await;
    assert_eq!(listed["count"], 0, "its workspace went: {listed}");
    let agents = h.ok("agent_list", json!({})).await;
    assert_eq!(agents["agents"], json!([]), "no record: {agents}");
    h.fails("agent_workspace", json!({}), "NOT_FOUND").await;

    // The session is no agent yet: it registers, made stopped.
    let made = h
        .ok(
            "agent_register",
            json!({"name": "alpha", "image": "fake", "start": false}),
        )
        .await;
    assert_eq!(made["state"], "stopped", "{made}");
    let name = made["workspace"].as_str().unwrap();
    assert!(name.starts_with("alpha-"), "{made}");
    let mine = h.ok("agent_workspace", json!({})).await;
    assert_eq!(mine["workspace"], name);
    assert_eq!(mine["state"], "stopped");
    let by_owner = h.ok("workspace_list", json!({"user": "alpha"})).await;
    assert_eq!(by_owner["workspaces"][0]["name"], name, "{by_owner}");
    h.fails(
        "agent_register",
        json!({"name": "beta", "image": "fake", "start": false}),
        "CONFLICT",
    )
    .await;
    h.finish().await;
}
