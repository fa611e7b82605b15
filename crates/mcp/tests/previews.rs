//! Previews of the destructive tools through a real MCP client, without
//! KVM: each says what would happen, fails as the real call would, and
//! leaves the state directory as it was.

mod common;

use common::McpHarness;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_of_destructive_tools_change_nothing() {
    let h = McpHarness::new("previews").await;
    h.fake_image("fake");
    h.ok(
        "workspace_create",
        json!({"name": "dev", "image": "fake", "ports": [{"host_port": 18080, "guest_port": 80}]}),
    )
    .await;
    let before = h.snapshot();
    let would = h
        .ok(
            "port_unpublish",
            json!({"workspace": "dev", "host_port": 18080, "preview": true}),
        )
        .await;
    let said = would["preview"].as_str().unwrap_or_default();
    assert!(
        said.starts_with("would stop publishing 127.0.0.1:18080"),
        "{would}"
    );
    assert_eq!(would["ports"], json!([]), "{would}");
    let listed = h.ok("port_list", json!({"workspace": "dev"})).await;
    assert_eq!(
        listed["ports"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    // Each preview checks what the call would: a missing thing is NOT_FOUND.
    for (tool, args) in [
        (
            "port_unpublish",
            json!({"workspace": "dev", "host_port": 18081, "preview": true}),
        ),
        ("cancel_task", json!({"task_id": "nope", "preview": true})),
        ("cleanup_task", json!({"task_id": "nope", "preview": true})),
        (
            "file_move",
            json!({"name": "gone", "from": "/a", "to": "/b", "preview": true}),
        ),
        (
            "file_edit",
            json!({"name": "gone", "path": "/a", "old_text": "x", "new_text": "y", "preview": true}),
        ),
        (
            "process_signal",
            json!({"name": "gone", "id": "proc-1", "preview": true}),
        ),
        ("browser_close", json!({"name": "gone", "preview": true})),
    ] {
        h.fails(tool, args, "NOT_FOUND").await;
    }
    assert_eq!(
        h.snapshot(),
        before,
        "previews left the state directory as it was"
    );
    h.finish().await;
}
