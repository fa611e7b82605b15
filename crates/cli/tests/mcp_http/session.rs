//! Session-scoped workspaces: gone within 10 s of their session's end,
//! whether a stdio client was killed outright or an HTTP client closed its
//! session; other workspaces stay.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{home, python, Server, BIN, CLIENT};

/// How long a session's workspaces may outlive it.
const GONE_WITHIN: Duration = Duration::from_secs(10);

fn needs_guest(test: &str) -> bool {
    testkit::require(test, testkit::mcp_python()).is_some()
        && testkit::require(test, testkit::guest_assets()).is_some()
        && testkit::require(test, testkit::workspace_image("minimal")).is_some()
}

/// Waits for workspace `name` of `home` to be gone; how long it took.
fn gone(home: &Path, name: &str) -> Option<Duration> {
    let began = Instant::now();
    let workspaces = home.join("workspaces");
    // Its directory is renamed `.deleting-NAME-*` first and removed with
    // its lock after: gone is when nothing of it is left.
    let deleting = format!(".deleting-{name}-");
    let left = || {
        workspaces.join(name).exists()
            || workspaces.join(format!("{name}.lock")).exists()
            || std::fs::read_dir(&workspaces)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&deleting))
    };
    testkit::wait_until(GONE_WITHIN, || !left()).then(|| began.elapsed())
}

fn create(name: &str, scoped: bool) -> Value {
    json!({"tool": "workspace_create",
           "args": {"name": name, "image": "minimal", "session_scoped": scoped}})
}

#[test]
fn a_session_scoped_workspace_goes_when_its_stdio_client_is_killed() {
    let test = "mcp_http::session::a_session_scoped_workspace_goes_when_its_stdio_client_is_killed";
    if !needs_guest(test) {
        return;
    }
    let home = home("stdio-scope");
    let mut env = json!({"MICROAGENT_HOME": home});
    if let Some(warm) = testkit::shared_warm_dir() {
        env["MICROAGENT_WARM_DIR"] = json!(warm);
    }
    let spec = json!({
    "stdio": [BIN, "serve", "mcp"], "env": env, "hold": true,
    "calls": [
        create("scoped", true),
        {"tool": "workspace_start", "args": {"name": "scoped"}},
        create("kept", false),
    ]});
    let mut client = Command::new(testkit::mcp_python().unwrap())
        .arg(CLIENT)
        .arg(spec.to_string())
        .current_dir(std::env::temp_dir())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(client.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let out: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    for call in out["calls"].as_array().unwrap() {
        assert_eq!(call["is_error"], false, "{out}");
    }
    assert_eq!(out["calls"][1]["structured"]["state"], "running", "{out}");
    // The client dies without a word; the server sees its stdin close.
    client.kill().unwrap();
    client.wait().unwrap();
    let took = gone(&home, "scoped").expect("the session's workspace is gone within 10 s");
    eprintln!(
        "session-scoped workspace gone {:.1} s after its client",
        took.as_secs_f64()
    );
    assert!(
        home.join("workspaces/kept").exists(),
        "other workspaces stay"
    );
    let status = Command::new(BIN)
        .args(["delete", "kept", "--force", "--yes"])
        .env("MICROAGENT_HOME", &home)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    assert!(testkit::wait_until(GONE_WITHIN, || {
        testkit::leftovers::processes_of(&home).is_empty()
    }));
    testkit::leftovers::assert_none(&home);
    let _ = std::fs::remove_dir_all(home);
}

#[test]
fn a_session_scoped_workspace_goes_when_its_server_is_killed() {
    let test = "mcp_http::session::a_session_scoped_workspace_goes_when_its_server_is_killed";
    if !needs_guest(test) {
        return;
    }
    let home = home("server-killed");
    let (mut client, out) = held(json!({
        "stdio": [BIN, "serve", "mcp"], "env": {"MICROAGENT_HOME": home}, "hold": true,
        "calls": [create("orphan", true)]}));
    assert_eq!(out["calls"][0]["is_error"], false, "{out}");
    // The server dies without a word: no session end runs.
    let server = out["calls"][0]["structured"]["spec"]["owner"]["pid"]
        .as_i64()
        .unwrap_or_else(|| panic!("{out}"));
    // SAFETY: kill(2) with plain integers.
    assert_eq!(unsafe { libc::kill(server as i32, libc::SIGKILL) }, 0);
    let took = gone(&home, "orphan").expect("the killed server's workspace is gone within 10 s");
    eprintln!(
        "session-scoped workspace gone {:.1} s after its server was killed",
        took.as_secs_f64()
    );
    // The watcher says why, once it is done.
    let log = || std::fs::read_to_string(home.join("owner-watch.log")).unwrap_or_default();
    assert!(
        testkit::wait_until(GONE_WITHIN, || log().contains("deleted workspace orphan")),
        "{}",
        log()
    );
    let _ = client.kill();
    let _ = client.wait();
    let _ = std::fs::remove_dir_all(home);
}

#[test]
fn a_session_scoped_workspace_goes_when_its_http_session_ends() {
    let test = "mcp_http::session::a_session_scoped_workspace_goes_when_its_http_session_ends";
    if !needs_guest(test) {
        return;
    }
    let home = home("http-scope");
    let server = Server::start(&home, &["--dev"]);
    let out = python(json!({
    "url": server.url,
    "calls": [
        create("scoped", true),
        create("kept", false),
        // Still there later in the same session.
        {"tool": "workspace_inspect", "args": {"name": "scoped"}},
    ]}))
    .unwrap();
    for call in out["calls"].as_array().unwrap() {
        assert_eq!(call["is_error"], false, "{out}");
    }
    // The SDK ended its session on the way out.
    let took = gone(&home, "scoped").expect("the session's workspace is gone within 10 s");
    eprintln!(
        "session-scoped workspace gone {:.1} s after its session",
        took.as_secs_f64()
    );
    assert!(
        home.join("workspaces/kept").exists(),
        "other workspaces stay"
    );
    assert!(
        server.stderr().contains("its MCP session ended"),
        "{}",
        server.stderr()
    );
    drop(server);
    let _ = std::fs::remove_dir_all(home);
}

/// client.py with `spec`, holding its session open until its stdin
/// closes: the child and the JSON it printed.
fn held(spec: Value) -> (std::process::Child, Value) {
    let mut client = Command::new(testkit::mcp_python().unwrap())
        .arg(CLIENT)
        .arg(spec.to_string())
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(client.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let out = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    (client, out)
}

#[test]
fn an_agent_and_its_workspace_last_as_long_as_its_session() {
    let test = "mcp_http::session::an_agent_and_its_workspace_last_as_long_as_its_session";
    if !needs_guest(test) {
        return;
    }
    let home = home("agents");
    let server = Server::start(&home, &["--dev"]);
    let register = json!({"tool": "agent_register",
        "args": {"name": "alpha", "capabilities": ["python"], "cpus": 1, "memory": 128,
                 "start": false}});
    let (mut alpha, out) = held(json!({
        "url": server.url, "hold": true,
        "calls": [register, {"tool": "agent_workspace", "args": {}}, register,
                  create("alpha-box", false),
                  {"tool": "snapshot_take", "args": {"workspace": "alpha-box", "name": "alpha-snap"}},
                  {"tool": "workspace_list", "args": {}}]}));
    let calls = out["calls"].as_array().unwrap();
    assert_eq!(calls[0]["is_error"], false, "{out}");
    let workspace = calls[0]["structured"]["workspace"]
        .as_str()
        .unwrap()
        .to_owned();
    let agent_id = calls[0]["structured"]["agent_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(calls[1]["structured"], calls[0]["structured"], "{out}");
    assert_eq!(
        calls[2]["structured"]["code"], "CONFLICT",
        "one per session: {out}"
    );
    // What the session makes once it is an agent is the agent's.
    assert_eq!(calls[3]["structured"]["spec"]["agent"], "alpha", "{out}");
    assert_eq!(calls[4]["is_error"], false, "{out}");
    let own = &calls[5]["structured"]["workspaces"];
    let agent_ws = own
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == workspace.as_str())
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(agent_ws["spec"]["mem_mib"], 128, "of the memory asked");
    assert_eq!(agent_ws["spec"]["agent"], "alpha");

    // Another agent sees alpha, and alpha's things only when it asks for
    // every agent's; using them is FORBIDDEN.
    let forbidden = |tool: &str, args: Value| json!({"tool": tool, "args": args});
    let other = python(json!({"url": server.url,
        "calls": [{"tool": "agent_register", "args": {"name": "beta", "start": false}},
                  {"tool": "agent_list", "args": {}},
                  forbidden("workspace_inspect", json!({"name": workspace})),
                  forbidden("workspace_delete", json!({"name": "alpha-box", "force": true})),
                  forbidden("snapshot_get", json!({"name": "alpha-snap"})),
                  {"tool": "workspace_list", "args": {}},
                  {"tool": "workspace_list", "args": {"namespace": "*", "all_agents": true}},
                  {"tool": "snapshot_list", "args": {"all_agents": true}},
                  {"tool": "workspace_create",
                   "args": {"name": "beta-box", "image": "minimal", "namespace": "team-b"}},
                  {"tool": "workspace_list", "args": {"namespace": "*"}},
                  {"tool": "workspace_delete", "args": {"name": "beta-box.team-b"}},
                  {"tool": "workspace_list", "args": {"user": "alpha"}}]}))
    .unwrap();
    let calls = other["calls"].as_array().unwrap();
    let agents = &calls[1]["structured"]["agents"];
    assert_eq!(agents.as_array().unwrap().len(), 2, "{other}");
    assert_eq!(agents[0]["agent_id"], agent_id.as_str());
    assert_eq!(agents[0]["name"], "alpha");
    assert_eq!(agents[0]["capabilities"], json!(["python"]));
    assert_eq!(agents[0]["workspace"], workspace.as_str());
    for refused in &calls[2..=4] {
        assert_eq!(refused["structured"]["code"], "FORBIDDEN", "{other}");
    }
    let names = |i: usize| -> Vec<String> {
        let listed = calls[i]["structured"]["workspaces"].as_array().unwrap();
        let mut names: Vec<String> = listed
            .iter()
            .map(|w| w["name"].as_str().unwrap().to_owned())
            .collect();
        names.sort();
        names
    };
    let beta_ws = calls[0]["structured"]["workspace"].as_str().unwrap();
    assert_eq!(names(5), [beta_ws], "its own only: {other}");
    let mut every = vec![
        "alpha-box".to_owned(),
        beta_ws.to_owned(),
        workspace.clone(),
    ];
    every.sort();
    assert_eq!(names(6), every, "{other}");
    let snapshots = &calls[7]["structured"]["snapshots"];
    assert_eq!(snapshots[0]["name"], "alpha-snap", "{other}");
    assert_eq!(calls[8]["structured"]["namespace"], "team-b", "{other}");
    assert_eq!(calls[8]["structured"]["name"], "beta-box.team-b", "{other}");
    let mut spanning = vec![beta_ws.to_owned(), "beta-box.team-b".to_owned()];
    spanning.sort();
    assert_eq!(names(9), spanning, "namespaces spanned: {other}");
    assert_eq!(calls[10]["is_error"], false, "{other}");
    // devbox's owner filter: alpha's, listed to another agent.
    let mut alphas = vec!["alpha-box".to_owned(), workspace.clone()];
    alphas.sort();
    assert_eq!(names(11), alphas, "{other}");

    // Alpha's client ends its session: the agent and its workspace go.
    drop(alpha.stdin.take());
    assert!(alpha.wait().unwrap().success());
    let took = gone(&home, &workspace).expect("the agent's workspace is gone within 10 s");
    eprintln!(
        "agent workspace gone {:.1} s after its session",
        took.as_secs_f64()
    );
    let after = python(json!({"url": server.url,
        "calls": [{"tool": "agent_list", "args": {}}]}))
    .unwrap();
    assert_eq!(
        after["calls"][0]["structured"]["agents"],
        json!([]),
        "{after}"
    );
    drop(server);

    // `serve mcp --agent` names a stdio session's agent, with no workspace.
    let named = python(json!({
        "stdio": [BIN, "serve", "mcp", "--agent", "gamma"], "env": {"MICROAGENT_HOME": home},
        "calls": [{"tool": "agent_workspace", "args": {}}, {"tool": "agent_list", "args": {}}]}))
    .unwrap();
    assert_eq!(
        named["calls"][0]["structured"]["workspace"],
        Value::Null,
        "{named}"
    );
    assert_eq!(
        named["calls"][1]["structured"]["agents"][0]["name"],
        "gamma"
    );
    assert!(
        std::fs::read_dir(home.join("agents"))
            .unwrap()
            .next()
            .is_none(),
        "records go"
    );
    let _ = std::fs::remove_dir_all(home);
}

/// A call longer than the session timeout keeps its session: the server
/// pings the client while it runs (rmcp would otherwise end the session
/// mid-call, and the client would see its stream end).
#[test]
fn a_call_longer_than_the_session_timeout_keeps_its_session() {
    let test = "mcp_http::session::a_call_longer_than_the_session_timeout_keeps_its_session";
    if testkit::require(test, testkit::mcp_python()).is_none()
        || testkit::require(test, testkit::guest_assets()).is_none()
        || testkit::require(test, testkit::workspace_image("minimal")).is_none()
    {
        return;
    }
    let home = super::home("long-call");
    let server = super::Server::start(&home, &["--session-timeout", "2"]);
    let token = std::fs::read_to_string(home.join("mcp-token")).unwrap();
    let out = super::python(json!({
    "url": server.url, "token": token.trim(),
    "calls": [
        {"tool": "workspace_create", "args": {"name": "long", "image": "minimal"}},
        {"tool": "workspace_start", "args": {"name": "long"}},
        {"tool": "workspace_exec", "args": {"name": "long", "command": ["sleep", "8"]}},
        {"tool": "workspace_exec", "args": {"name": "long", "command": ["echo", "still here"]}},
        {"tool": "workspace_delete", "args": {"name": "long", "force": true}},
    ]}))
    .unwrap();
    let calls = out["calls"].as_array().unwrap();
    for (i, call) in calls.iter().enumerate() {
        assert_eq!(call["is_error"], false, "call {i}: {out}");
    }
    assert_eq!(calls[3]["structured"]["stdout"], "still here\n", "{out}");
    drop(server);
    testkit::leftovers::assert_none(&home);
    let _ = std::fs::remove_dir_all(home);
}
