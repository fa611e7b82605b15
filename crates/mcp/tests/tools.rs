//! Every tool through a real MCP client, in process, without KVM: the tool
//! list and its schemas, bad input, previews, and the tools that need no
//! running workspace.

mod common;

use base64::Engine;
use common::McpHarness;
use rmcp::ServiceError;
use serde_json::{json, Value};
use testkit::mcp_tools::{OPEN_WORLD, READ_ONLY, TOOLS, WITH_PREVIEW};

/// The formats JSON Schema (2020-12) defines.
const STANDARD_FORMATS: [&str; 17] = [
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "regex",
];

fn collect_formats(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(f) = m.get("format").and_then(Value::as_str) {
                out.push(f.to_owned());
            }
            m.values().for_each(|v| collect_formats(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_formats(v, out)),
        _ => {}
    }
}

/// Checks a schema: valid JSON Schema, an object, every property described.
fn check_schema(tool: &str, what: &str, schema: &Value) {
    if let Err(e) = jsonschema::meta::validate(schema) {
        panic!("{tool}'s {what} schema is not valid JSON Schema: {e}\n{schema:#}");
    }
    assert_eq!(schema["type"], "object", "{tool} {what}: {schema:#}");
    let mut formats = Vec::new();
    collect_formats(schema, &mut formats);
    for format in formats {
        assert!(
            STANDARD_FORMATS.contains(&format.as_str()),
            "{tool} {what}: format {format:?} is not a JSON Schema format (Ajv warns)"
        );
    }
    let empty = serde_json::Map::new();
    let props = schema
        .get("properties")
        .map_or(Some(&empty), Value::as_object)
        .unwrap_or_else(|| panic!("{tool} {what}: properties is an object"));
    for (name, prop) in props {
        assert!(
            prop.get("description")
                .and_then(Value::as_str)
                .is_some_and(|d| !d.is_empty()),
            "{tool} {what}: property {name} has no description: {prop:#}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_every_tool_with_schemas_and_honest_annotations() {
    let h = McpHarness::new("list").await;
    let mut names: Vec<&str> = h.tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort();
    assert_eq!(names, TOOLS);
    for tool in &h.tools {
        let name = tool.name.as_ref();
        assert!(
            tool.description.as_deref().is_some_and(|d| d.len() > 20),
            "{name} is described"
        );
        check_schema(name, "input", &Value::Object((*tool.input_schema).clone()));
        let output = tool.output_schema.as_deref().expect("output schema");
        check_schema(name, "output", &Value::Object(output.clone()));
        let a = tool.annotations.as_ref().expect("annotations");
        assert!(a.title.is_some(), "{name} title");
        let open_world = OPEN_WORLD.contains(&name);
        assert_eq!(a.open_world_hint, Some(open_world), "{name}");
        assert_eq!(
            a.read_only_hint,
            Some(READ_ONLY.contains(&name)),
            "{name} read-only"
        );
        assert!(
            a.destructive_hint.is_some() && a.idempotent_hint.is_some(),
            "{name}"
        );
        if WITH_PREVIEW.contains(&name) {
            assert_eq!(a.destructive_hint, Some(true), "{name} destructive");
            assert!(
                tool.input_schema["properties"].get("preview").is_some(),
                "{name} takes preview"
            );
        }
        if READ_ONLY.contains(&name) {
            assert_eq!(a.destructive_hint, Some(false), "{name}");
        }
    }
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_tool_error_that_changes_nothing() {
    let h = McpHarness::new("bad").await;
    let host_file = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let before = h.snapshot();
    // A host port in use: publishing it is CONFLICT.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_port = held.local_addr().unwrap().port();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "workspace_create",
            json!({"name": "Bad Name"}),
            "INVALID_INPUT",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "vcpus": 9}),
            "INVALID_INPUT",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "vcpus": 300}),
            "INVALID_INPUT",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "mem_mib": 1}),
            "INVALID_INPUT",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "ttl_secs": 0}),
            "INVALID_INPUT",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "env": {"A B": "x"}}),
            "INVALID_INPUT",
        ),
        // Services: checked before any image is pulled (nine references to
        // a registry that is not there fail at once, not after nine pulls).
        (
            "workspace_create",
            json!({"name": "dev", "services": (0..9).map(|i| json!({"name": format!("s{i}"), "image": "127.0.0.1:1/x:1"})).collect::<Vec<_>>()}),
            "INVALID_INPUT",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "services": [{"name": "localhost", "image": "minimal", "command": "true"}]}),
            "INVALID_INPUT",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "services": [{"name": "db", "image": "minimal", "command": ["x"], "env": {"A B": "x"}}]}),
            "INVALID_INPUT",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "services": [{"name": "db", "image": "nope", "command": "true"}]}),
            "NOT_FOUND",
        ),
        (
            "workspace_logs",
            json!({"name": "nope", "service": "db"}),
            "NOT_FOUND",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "image": "nope"}),
            "NOT_FOUND",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "ports": [{"host_port": 0, "guest_port": 80}]}),
            "INVALID_INPUT",
        ),
        (
            "workspace_create",
            json!({"name": "dev", "ports": [{"host_port": held_port, "guest_port": 80}]}),
            "CONFLICT",
        ),
        (
            "port_publish",
            json!({"workspace": "missing", "host_port": 8080, "guest_port": 80}),
            "NOT_FOUND",
        ),
        (
            "port_publish",
            json!({"workspace": "missing", "host_port": 70000, "guest_port": 80}),
            "INVALID_INPUT",
        ),
        ("port_list", json!({"workspace": "missing"}), "NOT_FOUND"),
        (
            "port_unpublish",
            json!({"workspace": "missing", "host_port": 8080}),
            "NOT_FOUND",
        ),
        ("workspace_start", json!({"name": "missing"}), "NOT_FOUND"),
        (
            "process_start",
            json!({"name": "missing", "command": ["sleep", "1"]}),
            "NOT_FOUND",
        ),
        (
            "process_start",
            json!({"name": "missing", "command": ["sleep", "1"], "shell": "true"}),
            "INVALID_INPUT",
        ),
        (
            "process_start",
            json!({"name": "missing", "command": "sleep 1", "ring_bytes": 16777217}),
            "INVALID_INPUT",
        ),
        (
            "process_start",
            json!({"name": "missing", "command": "sleep 1", "timeout_secs": 0}),
            "INVALID_INPUT",
        ),
        ("process_list", json!({"name": "missing"}), "NOT_FOUND"),
        (
            "process_output",
            json!({"name": "missing", "id": "proc-1"}),
            "NOT_FOUND",
        ),
        (
            "process_output",
            json!({"name": "missing", "id": "proc-1", "wait_secs": 301}),
            "INVALID_INPUT",
        ),
        (
            "process_output",
            json!({"name": "missing", "id": "proc-1", "max_bytes": 0}),
            "INVALID_INPUT",
        ),
        (
            "process_write_stdin",
            json!({"name": "missing", "id": "proc-1", "data": "x"}),
            "NOT_FOUND",
        ),
        (
            "process_signal",
            json!({"name": "missing", "id": "proc-1"}),
            "NOT_FOUND",
        ),
        (
            "process_wait",
            json!({"name": "missing", "id": "proc-1", "timeout_secs": 3601}),
            "INVALID_INPUT",
        ),
        (
            "process_wait",
            json!({"name": "missing", "id": "proc-1", "timeout_secs": 1}),
            "NOT_FOUND",
        ),
        (
            "workspace_start",
            json!({"name": "missing", "timeout_secs": 0}),
            "INVALID_INPUT",
        ),
        ("workspace_stop", json!({"name": "missing"}), "NOT_FOUND"),
        (
            "workspace_stop",
            json!({"name": "missing", "timeout_secs": 601}),
            "INVALID_INPUT",
        ),
        ("workspace_halt", json!({"name": "-x"}), "INVALID_INPUT"),
        (
            "snapshot_take",
            json!({"workspace": "missing"}),
            "NOT_FOUND",
        ),
        (
            "snapshot_take",
            json!({"workspace": "missing", "bogus": 1}),
            "INVALID_INPUT",
        ),
        ("snapshot_get", json!({"name": "missing"}), "NOT_FOUND"),
        ("snapshot_get", json!({"name": "Bad Name"}), "INVALID_INPUT"),
        (
            "snapshot_delete",
            json!({"name": "missing", "preview": true}),
            "NOT_FOUND",
        ),
        ("snapshot_restore", json!({"name": "missing"}), "NOT_FOUND"),
        (
            "snapshot_restore",
            json!({"name": "missing", "as_name": "x", "in_place": true}),
            "INVALID_INPUT",
        ),
        (
            "snapshot_restore",
            json!({"name": "missing", "force": true}),
            "INVALID_INPUT",
        ),
        (
            "snapshot_restore",
            json!({"name": "missing", "timeout_secs": 0}),
            "INVALID_INPUT",
        ),
        (
            "workspace_fork",
            json!({"name": "missing", "new_name": "f"}),
            "NOT_FOUND",
        ),
        (
            "workspace_fork",
            json!({"name": "missing", "new_name": "f", "snapshot": "nope"}),
            "NOT_FOUND",
        ),
        (
            "workspace_halt",
            json!({"name": "missing", "preview": true}),
            "NOT_FOUND",
        ),
        ("workspace_delete", json!({"name": "missing"}), "NOT_FOUND"),
        (
            "workspace_delete",
            json!({"name": "missing", "preview": true}),
            "NOT_FOUND",
        ),
        ("workspace_inspect", json!({"name": "missing"}), "NOT_FOUND"),
        ("workspace_inspect", json!({"name": ""}), "INVALID_INPUT"),
        ("workspace_logs", json!({"name": "missing"}), "NOT_FOUND"),
        (
            "workspace_logs",
            json!({"name": "missing", "lines": 0}),
            "INVALID_INPUT",
        ),
        ("workspace_events", json!({"name": "missing"}), "NOT_FOUND"),
        (
            "workspace_events",
            json!({"name": "missing", "wait_secs": 601}),
            "INVALID_INPUT",
        ),
        (
            "workspace_exec",
            json!({"name": "missing", "command": ["true"]}),
            "NOT_FOUND",
        ),
        (
            "workspace_exec",
            json!({"name": "missing"}),
            "INVALID_INPUT",
        ),
        (
            "workspace_exec",
            json!({"name": "missing", "command": []}),
            "INVALID_INPUT",
        ),
        (
            "workspace_exec",
            json!({"name": "x", "command": ["a"], "shell": "a"}),
            "INVALID_INPUT",
        ),
        (
            "workspace_exec",
            json!({"name": "x", "shell": "a", "output_cap": 1u64 << 40}),
            "INVALID_INPUT",
        ),
        (
            "workspace_exec",
            json!({"name": "x", "shell": "a", "timeout_secs": 0}),
            "INVALID_INPUT",
        ),
        (
            "file_read",
            json!({"name": "missing", "path": "/etc/hostname"}),
            "NOT_FOUND",
        ),
        (
            "file_read",
            json!({"name": "missing", "path": "etc/hostname"}),
            "INVALID_INPUT",
        ),
        (
            "file_read",
            json!({"name": "missing", "path": "/x", "length": 0}),
            "INVALID_INPUT",
        ),
        (
            "file_write",
            json!({"name": "missing", "path": "/x", "content": "hi"}),
            "NOT_FOUND",
        ),
        (
            "file_write",
            json!({"name": "missing", "path": "/x", "content": "hi", "preview": true}),
            "NOT_FOUND",
        ),
        (
            "file_write",
            json!({"name": "x", "path": "/x", "content": "%%", "encoding": "base64"}),
            "INVALID_INPUT",
        ),
        (
            "file_write",
            json!({"name": "x", "path": "/x", "content": "", "mode": "999"}),
            "INVALID_INPUT",
        ),
        // Over file_write's limit, in either encoding: answered, not
        // dropped by the transport (the base64 line is 22 MiB).
        (
            "file_write",
            json!({"name": "x", "path": "/x", "content": "a".repeat(mcp::schema::files::MAX_WRITE_BYTES + 1)}),
            "INVALID_INPUT",
        ),
        (
            "file_write",
            json!({"name": "x", "path": "/x", "encoding": "base64",
                   "content": base64::engine::general_purpose::STANDARD.encode(vec![0u8; mcp::schema::files::MAX_WRITE_BYTES + 3])}),
            "INVALID_INPUT",
        ),
        (
            "file_list",
            json!({"name": "missing", "path": "/"}),
            "NOT_FOUND",
        ),
        (
            "copy_in",
            json!({"name": "missing", "host_path": host_file, "guest_path": "/x"}),
            "NOT_FOUND",
        ),
        (
            "copy_in",
            json!({"name": "missing", "host_path": "no/such/file", "guest_path": "/x"}),
            "INVALID_INPUT",
        ),
        (
            "copy_in",
            json!({"name": "missing", "host_path": host_file, "guest_path": "x", "preview": true}),
            "INVALID_INPUT",
        ),
        (
            "copy_out",
            json!({"name": "missing", "guest_path": "/etc/hostname", "host_path": "x"}),
            "NOT_FOUND",
        ),
        (
            "copy_out",
            json!({"name": "missing", "guest_path": "etc", "host_path": "x"}),
            "INVALID_INPUT",
        ),
        // Beyond loopback only for a server started --allow-public-ports.
        (
            "port_publish",
            json!({"workspace": "missing", "host_port": 8080, "guest_port": 80, "host_ip": "0.0.0.0"}),
            "FORBIDDEN",
        ),
        (
            "workspace_create",
            json!({"name": "pub", "ports": [{"host_ip": "::", "host_port": 8080, "guest_port": 80}]}),
            "FORBIDDEN",
        ),
        // Host changes are applied only by a server started
        // --allow-host-changes.
        (
            "image_build",
            json!({"name": "deb", "from": "debian:bookworm", "confirm": "1-2-3-4"}),
            "FORBIDDEN",
        ),
        (
            "run_code",
            json!({"code": "print(1)", "workspace": "missing"}),
            "NOT_FOUND",
        ),
        (
            "run_code",
            json!({"code": "print(1)", "workspace": "x", "vcpus": 2}),
            "INVALID_INPUT",
        ),
        ("run_code", json!({"code": "print(1)"}), "NOT_FOUND"),
        (
            "run_code",
            json!({"code": "print(1)", "mem_mib": 1}),
            "INVALID_INPUT",
        ),
        (
            "estimate_cost",
            json!({"duration_secs": 0}),
            "INVALID_INPUT",
        ),
        // A task's size is checked before anything is written or started.
        (
            "run_task",
            json!({"description": "x", "repo": "nope", "mem_mib": "1T"}),
            "INVALID_INPUT",
        ),
        (
            "estimate_cost",
            json!({"duration_secs": 60, "vcpus": 9}),
            "INVALID_INPUT",
        ),
        (
            "estimate_cost",
            json!({"duration_secs": 60, "mem_mib": 1}),
            "INVALID_INPUT",
        ),
        (
            "estimate_cost",
            json!({"duration_secs": 60, "count": 0}),
            "INVALID_INPUT",
        ),
    ];
    for (tool, args, code) in cases {
        let message = h.fails(tool, args, code).await;
        assert!(!message.is_empty());
    }
    assert_eq!(
        h.snapshot(),
        before,
        "failed calls left the state directory as it was"
    );
    let message = h
        .fails("run_code", json!({"code": "print(1)"}), "NOT_FOUND")
        .await;
    assert!(
        message.contains("`microagent setup --yes` (it builds debian)"),
        "{message}"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tools_are_json_rpc_errors_and_bad_arguments_invalid_input() {
    let h = McpHarness::new("rpc").await;
    match h.try_call("no_such_tool", json!({})).await {
        Err(ServiceError::McpError(e)) => assert!(e.message.contains("tool not found"), "{e:?}"),
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
    // Arguments that do not fit the input schema are tool errors the model
    // can correct (MCP SEP-1303), with the stable code.
    let cases = [
        ("workspace_create", json!({})),
        ("workspace_create", json!({"name": 7})),
        ("workspace_create", json!({"name": "dev", "vcpus": "two"})),
        ("workspace_create", json!({"name": "dev", "nmae": "typo"})),
        ("workspace_list", json!({"state": "sleeping"})),
        ("contract", json!({"extra": true})),
        ("estimate_cost", json!({"duration_secs": -5})),
        // A size is MiB or a number with a unit, nothing else.
        (
            "workspace_create",
            json!({"name": "dev", "mem_mib": "lots"}),
        ),
        (
            "workspace_create",
            json!({"name": "dev", "disk_mib": "1.5g"}),
        ),
        ("volume_create", json!({"name": "v", "size_mib": "10x"})),
    ];
    for (tool, args) in cases {
        let message = h.fails(tool, args, "INVALID_INPUT").await;
        assert!(message.contains("input schema"), "{tool}: {message}");
    }
    // The session survives them.
    h.ok("contract", json!({})).await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn life_cycle_without_a_vm_and_previews_that_change_nothing() {
    let h = McpHarness::new("life").await;
    h.fake_image("fake");
    let created = h
        .ok(
            "workspace_create",
            json!({"name": "dev", "image": "fake", "mem_mib": 128, "labels": {"team": "a"}, "env": {"K": "v"}}),
        )
        .await;
    assert_eq!(created["state"], "stopped");
    assert_eq!(created["spec"]["mem_mib"], 128);
    // Sizes as the seeds' clients write them.
    let sized = h
        .ok(
            "workspace_create",
            json!({"name": "sized", "image": "fake", "mem_mib": "1g", "disk_mib": "2GiB"}),
        )
        .await;
    assert_eq!(sized["spec"]["mem_mib"], 1024, "{sized}");
    assert_eq!(sized["spec"]["disk_mib"], 2048, "{sized}");
    h.ok("workspace_delete", json!({"name": "sized"})).await;
    h.fails(
        "workspace_create",
        json!({"name": "dev", "image": "fake"}),
        "CONFLICT",
    )
    .await;

    // A stopped workspace: host figures only, guest ones null.
    let m = h.ok("workspace_metrics", json!({"name": "dev"})).await;
    let dev = &m["workspaces"][0];
    assert_eq!(dev["state"], "stopped", "{m}");
    assert_eq!(dev["cpu_percent"], Value::Null, "{m}");
    assert!(dev["disk_size_bytes"].as_u64().unwrap() > 0, "{m}");
    let all = h.ok("workspace_metrics", json!({})).await;
    assert_eq!(all["workspaces"].as_array().unwrap().len(), 1, "{all}");
    // Every namespace with `*`; another namespace has none of them.
    h.ok(
        "workspace_create",
        json!({"name": "other", "image": "fake", "namespace": "team"}),
    )
    .await;
    let everywhere = h.ok("workspace_metrics", json!({"namespace": "*"})).await;
    assert_eq!(
        everywhere["workspaces"].as_array().unwrap().len(),
        2,
        "{everywhere}"
    );
    let team = h
        .ok("workspace_metrics", json!({"namespace": "team"}))
        .await;
    assert_eq!(team["workspaces"][0]["name"], "other.team", "{team}");
    assert_eq!(team["workspaces"].as_array().unwrap().len(), 1, "{team}");
    h.ok("workspace_delete", json!({"name": "other.team"}))
        .await;
    h.fails("workspace_metrics", json!({"name": "nope"}), "NOT_FOUND")
        .await;

    let before = h.snapshot();
    for tool in ["workspace_stop", "workspace_halt"] {
        let r = h.ok(tool, json!({"name": "dev", "preview": true})).await;
        assert_eq!(r["preview"], true);
        assert!(
            r["action"].as_str().unwrap().contains("does nothing"),
            "{r}"
        );
    }
    let r = h
        .ok("workspace_delete", json!({"name": "dev", "preview": true}))
        .await;
    assert!(
        r["action"].as_str().unwrap().starts_with("would delete"),
        "{r}"
    );
    assert_eq!(r["workspace"]["name"], "dev");
    // Previews of guest writes need the workspace running, as the writes do.
    h.fails(
        "file_write",
        json!({"name": "dev", "path": "/x", "content": "hi", "preview": true}),
        "NOT_RUNNING",
    )
    .await;
    h.fails(
        "copy_in",
        json!({"name": "dev", "host_path": concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"), "guest_path": "/x", "preview": true}),
        "NOT_RUNNING",
    )
    .await;
    h.fails(
        "copy_out",
        json!({"name": "dev", "guest_path": "/etc/hostname", "host_path": "x", "preview": true}),
        "NOT_RUNNING",
    )
    .await;
    h.fails(
        "workspace_exec",
        json!({"name": "dev", "command": ["true"]}),
        "NOT_RUNNING",
    )
    .await;
    assert_eq!(h.snapshot(), before, "previews changed nothing");

    let list = h
        .ok("workspace_list", json!({"labels": {"team": "a"}}))
        .await;
    assert_eq!(list["count"], 1);
    let none = h.ok("workspace_list", json!({"state": "running"})).await;
    assert_eq!(none["count"], 0);
    let info = h.ok("workspace_inspect", json!({"name": "dev"})).await;
    assert_eq!(info["spec"]["env"]["K"], "v");
    assert!(info["dir"].as_str().unwrap().ends_with("/workspaces/dev"));
    let logs = h.ok("workspace_logs", json!({"name": "dev"})).await;
    assert_eq!(logs["lines"], json!([]));
    let events = h.ok("workspace_events", json!({"name": "dev"})).await;
    assert_eq!(events["events"][0]["kind"], "created");
    assert_eq!(events["next_after"], 1);
    let started = std::time::Instant::now();
    let waited = h
        .ok(
            "workspace_events",
            json!({"name": "dev", "after": 1, "wait_secs": 1}),
        )
        .await;
    assert_eq!(waited["events"], json!([]));
    assert_eq!(waited["next_after"], 1);
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    let images = h.ok("image_list", json!({})).await;
    assert_eq!(images["images"][0]["used_by"], json!(["dev"]));

    // Starting needs the VMM executable, which does not exist here.
    let message = h
        .fails("workspace_start", json!({"name": "dev"}), "INTERNAL")
        .await;
    assert!(message.contains("/nonexistent-vmm"), "{message}");

    let deleted = h.ok("workspace_delete", json!({"name": "dev"})).await;
    assert_eq!(deleted["preview"], false);
    h.fails("workspace_inspect", json!({"name": "dev"}), "NOT_FOUND")
        .await;
    assert_eq!(h.ok("workspace_list", json!({})).await["count"], 0);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn information_tools_answer() {
    let h = McpHarness::new("info").await;
    let contract = h.ok("contract", json!({})).await;
    assert_eq!(contract["error_codes"].as_array().unwrap().len(), 8);
    assert_eq!(contract["limits"]["max_vcpus"], 8);
    assert_eq!(contract["mcp"]["default_output_cap"], 65536);

    let cost = h
        .ok(
            "estimate_cost",
            json!({"duration_secs": 7200, "vcpus": 2, "mem_mib": 1024}),
        )
        .await;
    assert_eq!(cost["vcpu_hours"], 4.0);
    assert_eq!(cost["gib_hours"], 2.0);
    assert_eq!(cost["price_source"], "defaults");
    assert!((cost["total"].as_f64().unwrap() - (4.0 * 0.04 + 2.0 * 0.005)).abs() < 1e-9);
    std::fs::write(
        h.root.join("config.json"),
        r#"{"price": {"per_vcpu_hour": 1.0, "per_gib_hour": 0.5, "currency": "EUR"}}"#,
    )
    .unwrap();
    let cost = h
        .ok("estimate_cost", json!({"duration_secs": 3600, "count": 3}))
        .await;
    assert_eq!(cost["total"], 3.0 + 3.0 * 0.25 * 0.5);
    assert_eq!(cost["price"]["currency"], "EUR");
    std::fs::write(
        h.root.join("config.json"),
        r#"{"price": {"per_vcpu_hour": "x"}}"#,
    )
    .unwrap();
    let message = h
        .fails(
            "estimate_cost",
            json!({"duration_secs": 60}),
            "INVALID_INPUT",
        )
        .await;
    assert!(message.contains("config.json"), "{message}");

    let images = h.ok("image_list", json!({})).await;
    assert_eq!(images["images"], json!([]));
    let doctor = h.ok("host_doctor", json!({})).await;
    assert!(["ok", "warn", "fail"].contains(&doctor["status"].as_str().unwrap()));
    assert!(doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["name"] == "state_dir" && c["status"] == "ok"));
    h.finish().await;
}
