//! Networks, images, TTLs and progress notifications through a real MCP
//! client, in process, without KVM (the tool list and the rest are in
//! tools.rs).

mod common;

use common::McpHarness;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networks_are_objects_workspaces_name_and_host_changes_wait_for_a_token() {
    let h = McpHarness::new("nets").await;
    h.fake_image("fake");
    let listed = h.ok("network_list", json!({})).await;
    let names: Vec<&str> = listed["networks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert_eq!(names, ["user", "none"]);
    let before = h.snapshot();
    for (args, code) in [
        (
            json!({"name": "corp", "egress": "none", "allow": ["pypi.org"]}),
            "INVALID_INPUT",
        ),
        (
            json!({"name": "corp", "subnet": "10.0.0.1/24"}),
            "INVALID_INPUT",
        ),
        (
            json!({"name": "corp", "backend": "tap", "egress": "allowlist"}),
            "INVALID_INPUT",
        ),
        (json!({"name": "Corp"}), "INVALID_INPUT"),
        (json!({"name": "user"}), "CONFLICT"),
        // A private range opens the host's side: the server has no grant.
        (
            json!({"name": "corp", "backend": "tap", "egress": "allowlist", "allow": ["pypi.org", "10.1.0.0/16"]}),
            "FORBIDDEN",
        ),
    ] {
        h.fails("network_create", args, code).await;
    }
    assert!(h.snapshot() == before, "refused creates changed nothing");
    let corp = h
        .ok(
            "network_create",
            json!({"name": "corp", "backend": "tap", "egress": "allowlist", "allow": ["pypi.org"]}),
        )
        .await;
    assert_eq!(corp["subnet"], "10.89.0.0/24");
    assert_eq!(corp["gateway"], "10.89.0.1");
    assert_eq!(corp["bridge"], "microagent0");
    h.fails(
        "workspace_create",
        json!({"name": "dev", "image": "fake", "network": "missing"}),
        "NOT_FOUND",
    )
    .await;
    let dev = h
        .ok(
            "workspace_create",
            json!({"name": "dev", "image": "fake", "network": "corp"}),
        )
        .await;
    assert_eq!(dev["spec"]["address"], "10.89.0.2");
    let other = h
        .ok(
            "workspace_create",
            json!({"name": "dev2", "image": "fake", "network": "corp"}),
        )
        .await;
    assert_eq!(other["spec"]["address"], "10.89.0.3");
    let inspected = h.ok("network_inspect", json!({"name": "corp"})).await;
    assert_eq!(inspected["workspaces"], json!(["dev", "dev2"]));
    h.fails("network_delete", json!({"name": "corp"}), "CONFLICT")
        .await;
    h.fails("network_delete", json!({"name": "user"}), "CONFLICT")
        .await;
    h.fails("network_inspect", json!({"name": "gone"}), "NOT_FOUND")
        .await;

    // A preview changes nothing on the host (the first makes the state
    // directory's token key) and its token is bound to its plan.
    h.ok("host_networking_setup", json!({})).await;
    let before = h.snapshot();
    let preview = h.ok("host_networking_setup", json!({})).await;
    assert_eq!(preview["applied"], false);
    let steps = preview["plan"]["steps"].as_array().unwrap();
    assert!(steps.iter().any(|s| s["program"] == "nft"), "{preview:#}");
    assert!(preview["token"].as_str().is_some_and(|t| t.len() > 20));
    // This server was not granted host changes: even the right token is
    // refused.
    let token = preview["token"].as_str().unwrap();
    for args in [json!({"confirm_token": token}), json!({"confirm": token})] {
        h.fails("host_networking_setup", args, "FORBIDDEN").await;
    }
    h.fails(
        "host_networking_setup",
        json!({"confirm": token, "confirm_token": "other"}),
        "INVALID_INPUT",
    )
    .await;
    assert!(
        h.snapshot() == before,
        "a preview and a refused token changed nothing"
    );

    for ws in ["dev", "dev2"] {
        h.ok("workspace_delete", json!({"name": ws})).await;
    }
    let would = h
        .ok("network_delete", json!({"name": "corp", "preview": true}))
        .await;
    assert_eq!(would["action"], "would delete");
    h.ok("network_inspect", json!({"name": "corp"})).await;
    h.ok("network_delete", json!({"name": "corp"})).await;
    h.fails("network_inspect", json!({"name": "corp"}), "NOT_FOUND")
        .await;
    h.finish().await;
}

/// Records the progress notifications a client receives.
#[derive(Clone, Default)]
struct ProgressRecorder(std::sync::Arc<std::sync::Mutex<Vec<(String, f64)>>>);

impl rmcp::ClientHandler for ProgressRecorder {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        let token = match params.progress_token.0 {
            rmcp::model::NumberOrString::String(s) => s.to_string(),
            rmcp::model::NumberOrString::Number(n) => n.to_string(),
        };
        self.0.lock().unwrap().push((token, params.progress));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_call_reports_progress_while_it_waits() {
    use rmcp::model::{CallToolRequestParams, ProgressToken, RequestParamsMeta};
    use rmcp::ServiceExt;
    let h = McpHarness::new("beat").await;
    h.fake_image("fake");
    // A second client that records notifications, on the same state.
    let server = mcp::MicroagentServer::new(h.ws.clone(), common::host_roots(&h.root));
    let (server_end, client_end) = tokio::io::duplex(1 << 20);
    let (reader, writer) = tokio::io::split(server_end);
    tokio::spawn(mcp::serve(server, reader, writer));
    let recorder = ProgressRecorder::default();
    let client = recorder.clone().serve(client_end).await.unwrap();
    // The workspace's lock is held for 2.5 s: the create waits for it.
    let lock = h.ws.state_dir().lock_workspace("dev").unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(2500));
        drop(lock);
    });
    let mut params = CallToolRequestParams::new("workspace_create").with_arguments(
        json!({"name": "dev", "image": "fake"})
            .as_object()
            .unwrap()
            .clone(),
    );
    params.set_progress_token(ProgressToken(rmcp::model::NumberOrString::String(
        "slow".into(),
    )));
    let result = client.call_tool(params).await.unwrap();
    release.join().unwrap();
    assert_eq!(result.is_error, Some(false), "{result:?}");
    let seen = recorder.0.lock().unwrap().clone();
    // (rmcp's client puts its own token on each request.)
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0].1 < w[1].1),
        "progress increases: {seen:?}"
    );
    client.cancel().await.unwrap();
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_are_durations_and_extend() {
    let h = McpHarness::new("ttl").await;
    h.fake_image("fake");
    let made = h
        .ok(
            "workspace_create",
            json!({"name": "dev", "image": "fake", "ttl": "1h"}),
        )
        .await;
    assert_eq!(made["spec"]["ttl_secs"], 3600);
    let longer = h
        .ok("workspace_extend_ttl", json!({"name": "dev", "by": "30m"}))
        .await;
    assert_eq!(longer["spec"]["ttl_secs"], 5400);
    let set = h
        .ok(
            "workspace_extend_ttl",
            json!({"name": "dev", "ttl_secs": 60}),
        )
        .await;
    assert_eq!(set["spec"]["ttl_secs"], 60);
    // Neither: an hour more (agentkernel's default).
    let hour = h.ok("workspace_extend_ttl", json!({"name": "dev"})).await;
    assert_eq!(hour["spec"]["ttl_secs"], 3660);
    let before = h.snapshot();
    for args in [
        json!({"name": "dev", "by": "1h", "ttl_secs": 5}),
        json!({"name": "dev", "by": "soon"}),
        json!({"name": "dev", "ttl_secs": 0}),
    ] {
        h.fails("workspace_extend_ttl", args, "INVALID_INPUT").await;
    }
    h.fails(
        "workspace_create",
        json!({"name": "dev2", "image": "fake", "ttl": "1h", "ttl_secs": 5}),
        "INVALID_INPUT",
    )
    .await;
    h.fails(
        "workspace_extend_ttl",
        json!({"name": "ghost", "by": "1h"}),
        "NOT_FOUND",
    )
    .await;
    assert!(h.snapshot() == before, "refused calls changed nothing");
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_inspected_imported_and_deleted() {
    let h = McpHarness::new("imgs").await;
    h.fake_image("fake");
    h.ok("workspace_create", json!({"name": "dev", "image": "fake"}))
        .await;
    let info = h.ok("image_inspect", json!({"name": "fake"})).await;
    assert_eq!(info["used_by"], json!(["dev"]), "{info}");
    assert!(info["rootfs_bytes"].as_u64().unwrap() > 0);
    let src = h.root.join("src-copy");
    testkit::fake_image_files(&src);
    let before = h.snapshot();
    h.fails("image_delete", json!({"name": "fake"}), "CONFLICT")
        .await;
    h.fails(
        "image_delete",
        json!({"name": "fake", "preview": true}),
        "CONFLICT",
    )
    .await;
    h.fails("image_inspect", json!({"name": "ghost"}), "NOT_FOUND")
        .await;
    h.fails(
        "image_import",
        json!({"name": "fake", "dir": src.display().to_string()}),
        "CONFLICT",
    )
    .await;
    h.fails(
        "image_import",
        json!({"name": "other", "dir": "nonexistent-dir"}),
        "INVALID_INPUT",
    )
    .await;
    assert!(h.snapshot() == before, "refused calls changed nothing");
    let imported = h
        .ok(
            "image_import",
            json!({"name": "copy", "dir": src.display().to_string()}),
        )
        .await;
    assert_eq!(imported["name"], "copy");
    let would = h
        .ok("image_delete", json!({"name": "copy", "preview": true}))
        .await;
    assert_eq!(would["action"], "would delete");
    h.ok("image_inspect", json!({"name": "copy"})).await;
    h.ok("image_delete", json!({"name": "copy"})).await;
    h.fails("image_inspect", json!({"name": "copy"}), "NOT_FOUND")
        .await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_bad_input_and_leaves_nothing() {
    let h = McpHarness::new("run").await;
    h.fake_image("fake");
    let many: Vec<_> = (0..17)
        .map(|i| json!({"path": format!("/tmp/{i}"), "content": ""}))
        .collect();
    for args in [
        json!({}),
        json!({"command": [], "image": "fake"}),
        json!({"command": ["true"], "shell": "true"}),
        json!({"shell": "true", "files": many}),
        json!({"shell": "true", "files": [{"path": "relative", "content": ""}]}),
        json!({"shell": "true", "timeout_secs": 0}),
        json!({"shell": "true", "start_timeout_secs": 0}),
        json!({"shell": "true", "network": "Bad Net"}),
    ] {
        h.fails("run", args, "INVALID_INPUT").await;
    }
    h.fails(
        "run",
        json!({"shell": "true", "image": "nope"}),
        "NOT_FOUND",
    )
    .await;
    h.fails(
        "run",
        json!({"shell": "true", "image": "fake", "network": "corp"}),
        "NOT_FOUND",
    )
    .await;
    let listed = h.ok("workspace_list", json!({})).await;
    assert_eq!(listed["count"], 0, "{listed}");
    assert!(
        !h.snapshot()
            .keys()
            .any(|k| k.to_string_lossy().contains("/workspaces/run-")),
        "no one-shot workspace is left"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_paths_outside_the_allowed_roots_are_forbidden() {
    let h = McpHarness::new("roots").await;
    h.fake_image("fake");
    // Outside every root: a secret file, an image directory, and a symlink
    // inside a root that leads to them.
    let outside = std::path::PathBuf::from(format!("/tmp/mcp-outside-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outside);
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "private").unwrap();
    testkit::fake_image_files(&outside.join("img"));
    std::os::unix::fs::symlink(&outside, h.root.join("link")).unwrap();
    let inside_img = h.root.join("img-links");
    std::fs::create_dir_all(&inside_img).unwrap();
    for f in ["vmlinux", "rootfs.ext4"] {
        std::os::unix::fs::symlink(outside.join("img").join(f), inside_img.join(f)).unwrap();
    }
    let before = h.snapshot();
    let secret = outside.join("secret").display().to_string();
    let cases = [
        (
            "copy_in",
            json!({"name": "dev", "host_path": secret, "guest_path": "/x"}),
        ),
        (
            "copy_in",
            json!({"name": "dev", "host_path": "link/secret", "guest_path": "/x"}),
        ),
        (
            "copy_in",
            json!({"name": "dev", "host_path": "../../etc/passwd", "guest_path": "/x"}),
        ),
        (
            "copy_out",
            json!({"name": "dev", "guest_path": "/etc/hostname", "host_path": outside.join("new").display().to_string()}),
        ),
        (
            "copy_out",
            json!({"name": "dev", "guest_path": "/etc/hostname", "host_path": "link/new"}),
        ),
        (
            "copy_out",
            json!({"name": "dev", "guest_path": "/etc/hostname", "host_path": "link", "overwrite": true}),
        ),
        (
            "image_import",
            json!({"name": "stolen", "dir": outside.join("img").display().to_string()}),
        ),
        ("image_import", json!({"name": "stolen", "dir": "link/img"})),
        (
            "image_import",
            json!({"name": "stolen", "dir": inside_img.display().to_string()}),
        ),
    ];
    for (tool, args) in cases {
        let message = h.fails(tool, args, "FORBIDDEN").await;
        assert!(!message.contains("private"), "{message}");
    }
    assert!(h.snapshot() == before, "refused copies changed nothing");
    let left: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "nothing was written outside: {left:?}");
    h.fails("image_inspect", json!({"name": "stolen"}), "NOT_FOUND")
        .await;
    std::fs::remove_dir_all(&outside).unwrap();
    h.finish().await;
}
