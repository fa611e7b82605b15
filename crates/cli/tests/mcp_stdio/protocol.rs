//! The protocol over stdio: an initialize piped in, the version the client
//! asked for, the tool list and a failure's stable code.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{home, initialize, Session, BIN};

#[test]
fn an_initialize_piped_in_is_answered_and_the_server_exits() {
    let home = home("echo");
    let mut child = Command::new(BIN)
        .args(["serve", "mcp"])
        .env("MICROAGENT_HOME", &home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", initialize(1, "2025-06-18")).unwrap();
    drop(stdin);
    let started = Instant::now();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one answer and nothing else on stdout: {out}"
    );
    let answer: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(answer["id"], 1);
    assert_eq!(answer["result"]["serverInfo"]["name"], "microagent");
    let _ = std::fs::remove_dir_all(home);
}

#[test]
fn initialize_answers_in_the_protocol_version_the_client_asked_for() {
    for version in ["2025-06-18", "2025-11-25"] {
        let (s, init) = Session::start_with(&format!("v{}", &version[..7]), version);
        assert_eq!(init["result"]["protocolVersion"], version, "{init}");
        assert_eq!(
            init["result"]["serverInfo"]["version"],
            env!("CARGO_PKG_VERSION"),
            "{init}"
        );
        drop(s);
    }
    // A version we do not know gets one we do (the client decides).
    let (_s, init) = Session::start_with("vunknown", "2099-01-01");
    let offered = init["result"]["protocolVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        offered.as_str() >= "2025-06-18" && offered.as_str() < "2099",
        "{init}"
    );
}

#[test]
fn lists_the_tools_and_exits_when_stdin_closes() {
    let mut s = Session::start("list");
    let id = s.next_id();
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
    let listed = s.response(id, Duration::from_secs(30));
    // Less the conformance suite's fixture, which test builds list; the
    // in-process suite (crates/mcp/tests/tools.rs) checks the list by name.
    let mut tools = listed["result"]["tools"].as_array().unwrap().clone();
    tools.retain(|t| t["name"] != "json_schema_2020_12_tool");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(tools.len(), testkit::mcp_tools::TOOLS.len(), "{names:?}");
    for snapshot_tool in ["snapshot_take", "snapshot_restore", "workspace_fork"] {
        assert!(names.contains(&snapshot_tool), "{names:?}");
    }
    for tool in tools {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
        assert_eq!(tool["outputSchema"]["type"], "object", "{tool}");
        let open_world = testkit::mcp_tools::OPEN_WORLD
            .iter()
            .any(|t| tool["name"] == *t);
        assert_eq!(tool["annotations"]["openWorldHint"], open_world, "{tool}");
    }
    // A failed operation is a result with the stable code.
    let id = s.call_async("workspace_inspect", json!({"name": "missing"}), None);
    let failed = s.response(id, Duration::from_secs(30));
    assert_eq!(failed["result"]["isError"], true, "{failed}");
    assert_eq!(failed["result"]["structuredContent"]["code"], "NOT_FOUND");
    // An unknown tool is a JSON-RPC error.
    let id = s.call_async("no_such_tool", json!({}), None);
    let unknown = s.response(id, Duration::from_secs(30));
    assert!(unknown["error"]["code"].is_i64(), "{unknown}");
    s.close();
}
