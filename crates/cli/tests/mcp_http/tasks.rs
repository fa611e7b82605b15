//! Long calls as MCP tasks, through the official Python SDK speaking the
//! stateless 2026-07-28 protocol: `image_pull` from a real registry on
//! loopback is answered with a task, polled until its result is in it; a
//! second pull, cancelled at once, ends `cancelled` and leaves no image,
//! no partial download and no conversion scratch behind.

use std::time::Duration;

use serde_json::{json, Value};
use testkit::oci::{ImageLayer, Registry};

use super::{home, python_script, Server};

const TASKS_CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/mcp_http/tasks_client.py"
);

/// Bytes of the layer of the image whose pull is cancelled: enough that
/// its download and conversion take seconds, so the cancel lands first.
const BIG_LAYER_BYTES: usize = 192 << 20;

/// Bytes that neither compress nor read as holes.
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Names under `dir` that contain `part`.
fn entries_with(dir: &std::path::Path, part: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(part))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn long_pulls_are_tasks_polled_to_the_end_or_cancelled() {
    let test = "mcp_http::tasks::long_pulls_are_tasks_polled_to_the_end_or_cancelled";
    if testkit::require(test, testkit::mcp_python()).is_none()
        || testkit::require(test, testkit::workspace_image("minimal")).is_none()
    {
        return;
    }
    let Some(skopeo) = testkit::require(test, testkit::host_tool("skopeo")) else {
        return;
    };
    let home = home("tasks");
    let Some(registry) = testkit::require(test, Registry::start(&home.join("registry"))) else {
        return;
    };
    let small = home.join("small");
    testkit::oci::write_layout(&small);
    let small_ref = format!("127.0.0.1:{}/small:1", registry.port);
    testkit::oci::push(&skopeo, &small, &small_ref);
    let big = home.join("big");
    let data = noise(BIG_LAYER_BYTES);
    let layer = ImageLayer::tar(&[("data/blob", None, &data)]);
    drop(data);
    testkit::oci::write_image(&big, &[layer], json!({}), 0);
    let big_ref = format!("127.0.0.1:{}/big:1", registry.port);
    testkit::oci::push(&skopeo, &big, &big_ref);

    let server = Server::start(&home, &["--dev"]);
    let out = python_script(
        TASKS_CLIENT,
        json!({"url": server.url, "calls": [
            {"tool": "image_pull", "args": {"reference": small_ref}},
            {"tool": "image_pull", "args": {"reference": big_ref}, "cancel": true},
            {"tool": "image_list", "args": {}},
        ]}),
    )
    .unwrap();
    assert_eq!(out["protocol"], "2026-07-28", "{out}");
    let calls = out["calls"].as_array().unwrap();
    let pulled = &calls[0];
    assert_eq!(pulled["task"], true, "{out}");
    assert_eq!(pulled["status"], "completed", "{out}");
    let result: &Value = &pulled["result"];
    assert_eq!(
        result["structuredContent"]["image"]["name"], "small-1",
        "{out}"
    );
    assert_ne!(result["isError"], true, "{out}");
    let cancelled = &calls[1];
    assert_eq!(cancelled["task"], true, "{out}");
    assert_eq!(cancelled["status"], "cancelled", "{out}");
    // Not a long tool: answered at once.
    assert_eq!(calls[2]["task"], false, "{out}");
    let listed = calls[2]["result"]["structuredContent"].to_string();
    assert!(
        listed.contains("small-1") && !listed.contains("big-1"),
        "{listed}"
    );

    // A conversion under way when the cancel came finishes in the
    // background and is thrown away.
    let images = home.join("images");
    let clean = testkit::wait_until(Duration::from_secs(60), || {
        entries_with(&images, "convert").is_empty()
            && entries_with(&images.join(".blobs/sha256"), ".partial-").is_empty()
    });
    assert!(
        clean,
        "left behind: {:?} {:?}",
        entries_with(&images, "convert"),
        entries_with(&images.join(".blobs/sha256"), ".partial-")
    );
    assert!(
        !images.join("big-1").exists(),
        "no image from the cancelled pull"
    );
    drop(server);
    drop(registry);
    let _ = std::fs::remove_dir_all(home);
}
