//! The volume tools through a real MCP client, without KVM: volumes are
//! made for real (mkfs.ext4, debugfs), a workspace that names one holds
//! it, and bad input changes nothing.

mod common;

use common::McpHarness;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_are_made_listed_held_and_deleted_through_mcp() {
    let test = "volumes_are_made_listed_held_and_deleted_through_mcp";
    if testkit::require(test, testkit::host_tool("mkfs.ext4")).is_none()
        || testkit::require(test, testkit::host_tool("debugfs")).is_none()
    {
        return;
    }
    let h = McpHarness::new("volumes").await;
    let src = h.root.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a.txt"), "hello").unwrap();

    let made = h
        .ok("volume_create", json!({"name": "cache", "size_mib": 64}))
        .await;
    assert_eq!(
        (made["name"].clone(), made["size_mib"].clone()),
        (json!("cache"), json!(64))
    );
    let filled = h
        .ok("volume_create", json!({"name": "seed", "from_dir": "src"}))
        .await;
    assert!(
        filled["source"].as_str().unwrap().starts_with("dir "),
        "{filled}"
    );

    // Bad input: a stable code, nothing made.
    let before = h.snapshot();
    h.fails("volume_create", json!({"name": "cache"}), "CONFLICT")
        .await;
    h.fails("volume_create", json!({"name": "Bad"}), "INVALID_INPUT")
        .await;
    h.fails(
        "volume_create",
        json!({"name": "big", "size_mib": 1}),
        "INVALID_INPUT",
    )
    .await;
    h.fails(
        "volume_create",
        json!({"name": "both", "from_dir": "src", "from_tar": "x.tar"}),
        "INVALID_INPUT",
    )
    .await;
    h.fails(
        "volume_create",
        json!({"name": "out", "from_dir": "/etc"}),
        "FORBIDDEN",
    )
    .await;
    h.fails("volume_inspect", json!({"name": "nope"}), "NOT_FOUND")
        .await;
    h.fails(
        "workspace_create",
        json!({"name": "ws", "volumes": [{"name": "nope", "path": "/data"}]}),
        "NOT_FOUND",
    )
    .await;
    h.fails(
        "workspace_create",
        json!({"name": "ws", "volumes": [{"name": "cache", "path": "data"}]}),
        "INVALID_INPUT",
    )
    .await;
    assert_eq!(h.snapshot(), before, "refusals changed the state directory");

    // A workspace that names it holds it: delete is refused until it goes.
    h.fake_image("minimal");
    h.ok(
        "workspace_create",
        json!({"name": "ws", "image": "minimal",
               "volumes": [{"name": "cache", "path": "/data", "read_only": true}]}),
    )
    .await;
    let listed = h.ok("volume_list", json!({})).await;
    let volumes = listed["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 2, "{listed}");
    let cache = h.ok("volume_inspect", json!({"name": "cache"})).await;
    assert_eq!(
        cache["holders"],
        json!([{"workspace": "ws", "path": "/data", "read_only": true, "active": false}])
    );
    let message = h
        .fails("volume_delete", json!({"name": "cache"}), "CONFLICT")
        .await;
    assert!(message.contains("ws"), "{message}");
    h.ok("workspace_delete", json!({"name": "ws"})).await;
    let preview = h
        .ok("volume_delete", json!({"name": "cache", "preview": true}))
        .await;
    assert_eq!(preview["action"], "would delete");
    h.ok("volume_inspect", json!({"name": "cache"})).await;
    let gone = h.ok("volume_delete", json!({"name": "cache"})).await;
    assert_eq!(gone["action"], "did delete");
    h.fails("volume_inspect", json!({"name": "cache"}), "NOT_FOUND")
        .await;
    h.finish().await;
}
