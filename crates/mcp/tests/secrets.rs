//! Secrets through a real MCP client, in process, without KVM: only the
//! ones `serve mcp --allow-secret` names may be asked for, and an unknown
//! one fails before anything is made.

mod common;

use common::McpHarness;
use serde_json::json;
use workspace::secrets::SecretValue;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_secrets_are_given_and_unknown_ones_fail_first() {
    let grants = mcp::Grants::default().allow_secret("API_TOKEN");
    let h = McpHarness::with_grants("secrets", grants).await;
    h.fake_image("fake");
    let value = SecretValue::new("DB_PASSWORD", b"hunter2".to_vec()).unwrap();
    h.ws.secrets().set("DB_PASSWORD", &value).unwrap();
    let before = h.snapshot();
    for (tool, args) in [
        (
            "workspace_exec",
            json!({"name": "nope", "shell": "echo $DB_PASSWORD", "secrets": ["DB_PASSWORD"]}),
        ),
        (
            "process_start",
            json!({"name": "nope", "shell": "env", "secrets": ["API_TOKEN", "DB_PASSWORD"]}),
        ),
        (
            "run",
            json!({"image": "fake", "shell": "env", "secrets": ["DB_PASSWORD"]}),
        ),
    ] {
        let text = h.fails(tool, args, "FORBIDDEN").await;
        assert!(
            text.contains("--allow-secret DB_PASSWORD"),
            "{tool}: {text}"
        );
        assert!(!text.contains("hunter2"), "{text}");
    }
    // Allowed, but not set: NOT_FOUND before a one-shot workspace is made.
    let text = h
        .fails(
            "run",
            json!({"image": "fake", "shell": "env", "secrets": ["API_TOKEN"]}),
            "NOT_FOUND",
        )
        .await;
    assert!(text.contains("microagent secret set API_TOKEN"), "{text}");
    assert!(h.snapshot() == before, "refused calls changed nothing");
    h.finish().await;
}
