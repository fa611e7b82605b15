//! The MCP tools on a server's workspaces, through the official Python
//! SDK over stdio.

use testkit::cli::CliHome;

use crate::BIN;

// Through MCP, with the official Python SDK over stdio: the servers,
// a command in the remote workspace, a create placed there; then an
// agent's workspace placed there and started, and every per-workspace
// tool on it (the handle's calls go to the server); another agent's
// calls on it are FORBIDDEN.
pub fn tools_reach_the_server(here: &CliHome, there: &CliHome) {
    let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_http/client.py");
    let call =
        |tool: &str, args: serde_json::Value| serde_json::json!({"tool": tool, "args": args});
    let session = |calls: Vec<serde_json::Value>| {
        let spec = serde_json::json!({
            "stdio": [BIN, "serve", "mcp", "--allow-host-path", here.home()],
            "env": {"MICROAGENT_HOME": here.home()},
            "calls": calls,
        });
        testkit::mcp_python_run(client, spec).unwrap()
    };
    let answer = session(vec![
        call("server_list", serde_json::json!({})),
        call(
            "workspace_exec",
            serde_json::json!({"name": "w1", "shell": "echo via-mcp; exit 4"}),
        ),
        call(
            "workspace_create",
            serde_json::json!({"name": "w4", "server": "remote1"}),
        ),
        call(
            "workspace_metrics",
            serde_json::json!({"server": "remote1"}),
        ),
    ]);
    let calls = &answer["calls"];
    let servers = &calls[0]["structured"]["servers"];
    assert_eq!(servers[1]["name"], "remote1", "{answer}");
    assert_eq!(servers[1]["status"], "online", "{answer}");
    let ran = &calls[1]["structured"];
    assert_eq!(
        (ran["exit_code"].as_i64(), ran["stdout"].as_str()),
        (Some(4), Some("via-mcp\n")),
        "{answer}"
    );
    assert_eq!(calls[2]["structured"]["name"], "w4", "{answer}");
    let metrics = &calls[3]["structured"]["workspaces"];
    assert_eq!(metrics[0]["name"], "w1", "{answer}");
    assert!(
        metrics[0]["memory_total_bytes"].as_u64().unwrap() > 0,
        "{answer}"
    );
    assert_eq!(
        there.ok_json(&["inspect", "w4", "--json"])["state"],
        "stopped"
    );
    here.ok(&["delete", "w4", "--yes"]);

    let w5 = |more: serde_json::Value| {
        let mut args = serde_json::json!({"name": "w5"});
        args.as_object_mut()
            .unwrap()
            .extend(more.as_object().unwrap().clone());
        args
    };
    let none = serde_json::json!({});
    // Each step is (what to call it, the tool, its arguments).
    let steps = [
        (
            "register",
            "agent_register",
            serde_json::json!({"name": "alpha", "start": false}),
        ),
        (
            "create",
            "workspace_create",
            serde_json::json!({"name": "w5", "server": "remote1", "start": true}),
        ),
        ("inspect", "workspace_inspect", w5(none.clone())),
        (
            "mkdir",
            "file_mkdir",
            w5(serde_json::json!({"path": "/tmp/d/sub"})),
        ),
        (
            "write",
            "file_write",
            w5(serde_json::json!({"path": "/tmp/d/a.txt", "content": "one\ntwo\n"})),
        ),
        (
            "read",
            "file_read",
            w5(serde_json::json!({"path": "/tmp/d/a.txt"})),
        ),
        (
            "edit",
            "file_edit",
            w5(serde_json::json!({"path": "/tmp/d/a.txt", "old_text": "two", "new_text": "2"})),
        ),
        (
            "lines",
            "file_read",
            w5(serde_json::json!({"path": "/tmp/d/a.txt", "start_line": 2})),
        ),
        (
            "move",
            "file_move",
            w5(serde_json::json!({"from": "/tmp/d/a.txt", "to": "/tmp/d/sub/b.txt"})),
        ),
        (
            "list",
            "file_list",
            w5(serde_json::json!({"path": "/tmp/d/sub"})),
        ),
        (
            "stat",
            "file_stat",
            w5(serde_json::json!({"path": "/tmp/d/sub/b.txt"})),
        ),
        (
            "find",
            "file_find",
            w5(serde_json::json!({"path": "/tmp/d", "pattern": "*.txt"})),
        ),
        (
            "remove",
            "file_remove",
            w5(serde_json::json!({"path": "/tmp/d", "recursive": true})),
        ),
        (
            "copy in",
            "copy_in",
            w5(
                serde_json::json!({"host_path": here.home().join("tree").to_str().unwrap(), "guest_path": "/tmp/t5"}),
            ),
        ),
        (
            "copy out",
            "copy_out",
            w5(
                serde_json::json!({"guest_path": "/tmp/t5/sub", "host_path": here.home().join("t5-back").to_str().unwrap()}),
            ),
        ),
        (
            "copy file out",
            "copy_out",
            w5(
                serde_json::json!({"guest_path": "/tmp/t5/sub/b.txt", "host_path": here.home().join("b5.txt").to_str().unwrap()}),
            ),
        ),
        ("browser events", "browser_events", w5(none.clone())),
        (
            "browser",
            "browser_open",
            w5(serde_json::json!({"url": "about:blank"})),
        ),
        ("halt", "workspace_halt", w5(none.clone())),
        ("start", "workspace_start", w5(none.clone())),
        (
            "process",
            "process_start",
            w5(serde_json::json!({"shell": "read x; echo got-$x", "stdin": true})),
        ),
        ("processes", "process_list", w5(none.clone())),
        (
            "exec",
            "workspace_exec",
            w5(
                serde_json::json!({"shell": "cat; echo err >&2; exit 3", "stdin": "through a call\n"}),
            ),
        ),
        (
            "outputs",
            "workspace_exec",
            w5(
                serde_json::json!({"shell": "mkdir -p /tmp/o5 && echo small > /tmp/o5/a.txt && head -c 1100000 /dev/zero > /tmp/o5/big.txt", "outputs": ["/tmp/o5/*.txt"]}),
            ),
        ),
        ("metrics", "workspace_metrics", w5(none.clone())),
        (
            "logs",
            "workspace_logs",
            w5(serde_json::json!({"lines": 5})),
        ),
        (
            "events",
            "workspace_events",
            w5(serde_json::json!({"after": 0})),
        ),
        ("ports", "port_list", serde_json::json!({"workspace": "w5"})),
        (
            "snapshot",
            "snapshot_take",
            serde_json::json!({"workspace": "w5", "name": "s5"}),
        ),
        (
            "snapshots",
            "snapshot_list",
            serde_json::json!({"workspace": "w5"}),
        ),
        (
            "fork",
            "workspace_fork",
            w5(serde_json::json!({"new_name": "w6"})),
        ),
        (
            "stop fork",
            "workspace_stop",
            serde_json::json!({"name": "w6"}),
        ),
        (
            "delete fork",
            "workspace_delete",
            serde_json::json!({"name": "w6"}),
        ),
    ];
    let answer = session(
        steps
            .iter()
            .map(|(_, tool, args)| call(tool, args.clone()))
            .collect(),
    );
    let calls = answer["calls"].as_array().unwrap();
    assert_eq!(calls.len(), steps.len(), "{answer}");
    let got: std::collections::BTreeMap<&str, &serde_json::Value> = steps
        .iter()
        .zip(calls)
        .map(|((step, ..), c)| {
            // The workspace's image has no Chromium (the server says
            // so).
            let refused = ["browser"].contains(step);
            assert_eq!(c["is_error"], refused, "{step}: {answer}");
            (*step, &c["structured"])
        })
        .collect();
    // Output files come back from the server: a small one inline, one
    // past the 1 MiB cap kept on this host under the kept outputs.
    let o = &got["outputs"]["outputs"];
    let shape = |i: usize| format!("{} {} {}", o[i]["path"], o[i]["size"], o[i]["returned"]);
    let want = r#""/tmp/o5/a.txt" 6 "text"|"/tmp/o5/big.txt" 1100000 "link""#;
    assert_eq!(format!("{}|{}", shape(0), shape(1)), want, "{answer}");
    let kept = std::path::PathBuf::from(o[1]["host_path"].as_str().unwrap_or_default());
    let size = kept.metadata().map(|m| m.len()).ok();
    assert!(
        kept.starts_with(here.home()) && size == Some(1_100_000),
        "{answer}"
    );
    assert_eq!(got["browser"]["code"], "INVALID_INPUT", "{answer}");
    assert!(
        answer
            .to_string()
            .contains("workspace `w5` has no Chromium"),
        "{answer}"
    );
    assert_eq!(
        got["browser events"]["events"],
        serde_json::json!([]),
        "{answer}"
    );
    assert_eq!(
        (
            got["exec"]["exit_code"].as_i64(),
            got["exec"]["stdout"].as_str()
        ),
        (Some(3), Some("through a call\n")),
        "{answer}"
    );
    assert_eq!(got["exec"]["stderr"], "err\n", "{answer}");
    let measured = &got["metrics"]["workspaces"][0];
    assert_eq!(measured["name"], "w5", "{answer}");
    assert!(
        measured["memory_total_bytes"].as_u64().unwrap() > 0,
        "{answer}"
    );
    assert_eq!(got["create"]["state"], "running", "{answer}");
    assert!(
        !here.home().join("workspaces/w5").exists(),
        "w5 is the server's"
    );
    assert_eq!(got["inspect"]["name"], "w5", "{answer}");
    let snapshots = got["snapshots"].to_string();
    assert!(snapshots.contains("\"s5\""), "the server's: {answer}");
    assert_eq!(got["read"]["content"], "one\ntwo\n", "{answer}");
    assert_eq!(got["lines"]["content"], "2\n", "{answer}");
    assert_eq!(got["list"]["entries"][0]["name"], "b.txt", "{answer}");
    assert_eq!(got["stat"]["stat"]["size"], 6, "{answer}");
    assert_eq!(got["find"]["matches"][0], "/tmp/d/sub/b.txt", "{answer}");
    assert_eq!(got["halt"]["action"], "halted workspace `w5`", "{answer}");
    assert_eq!(got["start"]["state"], "running", "{answer}");
    assert_eq!(
        got["processes"]["processes"][0]["state"], "running",
        "{answer}"
    );
    assert!(
        got["logs"]["lines"].as_array().unwrap().len() > 1,
        "{answer}"
    );
    assert!(
        got["events"]["events"].as_array().unwrap().len() > 2,
        "{answer}"
    );
    assert_eq!(got["snapshot"]["name"], "s5", "{answer}");
    assert_eq!(got["fork"]["name"], "w6", "{answer}");
    assert_eq!(got["copy in"]["unit"], "entries", "{answer}");
    assert_eq!(got["copy file out"]["transferred"], 5, "{answer}");
    for copied in [
        here.home().join("t5-back/b.txt"),
        here.home().join("b5.txt"),
    ] {
        assert_eq!(std::fs::read_to_string(&copied).unwrap(), "deep\n");
    }
    assert!(!here.home().join("servers/placed/w6.json").exists());
    let id = got["process"]["id"].as_str().unwrap();
    // A later session of the same agent reaches it again.
    let answer = session(vec![
        call(
            "agent_register",
            serde_json::json!({"name": "alpha", "start": false}),
        ),
        call(
            "process_write_stdin",
            w5(serde_json::json!({"id": id, "data": "x\n", "close": true})),
        ),
        call(
            "process_wait",
            w5(serde_json::json!({"id": id, "timeout_secs": 30})),
        ),
        call("process_output", w5(serde_json::json!({"id": id}))),
    ]);
    let calls = answer["calls"].as_array().unwrap();
    for (i, c) in calls.iter().enumerate() {
        assert_eq!(c["is_error"], false, "call {i}: {answer}");
    }
    assert_eq!(calls[3]["structured"]["stdout"], "got-x\n", "{answer}");

    // Another agent: FORBIDDEN before anything reaches the server.
    let answer = session(vec![
        call(
            "agent_register",
            serde_json::json!({"name": "beta", "start": false}),
        ),
        call("workspace_inspect", w5(none.clone())),
        call(
            "file_read",
            w5(serde_json::json!({"path": "/etc/hostname"})),
        ),
        call("workspace_exec", w5(serde_json::json!({"shell": "true"}))),
        call("workspace_delete", w5(serde_json::json!({"force": true}))),
        call("snapshot_take", serde_json::json!({"workspace": "w5"})),
        call("browser_events", w5(none.clone())),
        call(
            "copy_out",
            w5(
                serde_json::json!({"guest_path": "/etc", "host_path": here.home().join("stolen").to_str().unwrap()}),
            ),
        ),
    ]);
    let calls = answer["calls"].as_array().unwrap();
    for c in &calls[1..] {
        assert_eq!(c["structured"]["code"], "FORBIDDEN", "{answer}");
    }
    assert!(!here.home().join("stolen").exists());
    assert_eq!(
        there.ok_json(&["inspect", "w5", "--json"])["state"],
        "running"
    );
    here.ok(&["delete", "w5", "--yes", "--force"]);
    assert!(!here.home().join("servers/placed/w5.json").exists());
    here.ok(&["--server", "remote1", "snapshot", "rm", "s5"]);

    // An agent registered on a server: its workspace made there without
    // this host's sizes (the server's image gives them), running when
    // the answer comes, and deleted there when the session ends.
    let answer = session(vec![call(
        "agent_register",
        serde_json::json!({"name": "gamma", "server": "remote1"}),
    )]);
    let got = &answer["calls"][0];
    assert_eq!(got["is_error"], false, "{answer}");
    assert_eq!(got["structured"]["state"], "running", "{answer}");
    assert_eq!(got["structured"]["server"], "remote1", "{answer}");
    let made = got["structured"]["workspace"].as_str().unwrap();
    assert_eq!(
        there.run(&["inspect", made, "--json"]).error_code(),
        "NOT_FOUND",
        "deleted there with its session: {answer}"
    );
    assert!(!here
        .home()
        .join(format!("servers/placed/{made}.json"))
        .exists());
}
