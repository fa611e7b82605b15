//! MCP's `run_code` against a hostile agent (`guest_agent::fake`) on a
//! workspace's vsock socket: the interpreter probe and the script upload
//! succeed, then the script floods 1 GiB of output and goes silent. The
//! call ends with `TIMEOUT` past its timeout, the server never above 256
//! MiB resident. (The library's other entry points against the same fake:
//! crates/workspace/tests/hostile_agent.rs.) No KVM needed.

mod common;

use std::os::unix::net::UnixListener;

use guest_agent::fake::{self, Hostility};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn run_code_against_a_flooding_agent_ends_at_its_deadline() {
    let test = "run_code_against_a_flooding_agent_ends_at_its_deadline";
    if workspace::host::settings::host_tool("mkfs.ext4").is_none() {
        testkit::skip(
            test,
            "mkfs.ext4 is not installed (apt-get install e2fsprogs)",
        );
        return;
    }
    let h = common::McpHarness::new("hostile").await;
    h.fake_image("fake");
    h.ok(
        "workspace_create",
        json!({"name": "dev", "image": "fake", "disk_mib": 64}),
    )
    .await;
    let dir = workspace::StateDir::at(&h.root)
        .unwrap()
        .workspace_dir("dev")
        .unwrap();
    testkit::pretend_running(&dir);
    fake::serve(
        UnixListener::bind(dir.join("vsock.sock")).unwrap(),
        Hostility::FloodScriptsThenStall,
    );
    let message = h
        .fails(
            "run_code",
            json!({"workspace": "dev", "language": "python", "code": "print(1)",
                   "timeout_secs": 1, "output_cap": 65536}),
            "TIMEOUT",
        )
        .await;
    assert!(message.contains("did not report the end"), "{message}");
    let peak = testkit::peak_rss_kib();
    assert!(peak < 256 << 10, "peak resident {peak} KiB");
    // Never `delete` it: its "VMM" is this process.
    h.finish().await;
}
