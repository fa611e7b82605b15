//! `microagent serve mcp` as MCP clients run it: a subprocess spoken to in
//! raw newline-delimited JSON-RPC over its stdin and stdout. The life-cycle
//! test boots a real workspace and runs only where the guest assets are
//! built (it records a skip otherwise).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod protocol;
mod secrets;
mod tasks;

use secrets::{secrets_reach_the_command_only, SECRET_NAME};

const BIN: &str = env!("CARGO_BIN_EXE_microagent");

fn initialize(id: u64, version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": "mcp_stdio test", "version": "1"}
    }})
}

/// A state directory short enough for the VMM's Unix sockets.
fn home(tag: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/tmp/mcp-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A running `microagent serve mcp`.
struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    /// Notifications seen while waiting for responses.
    notifications: Vec<Value>,
    next_id: u64,
    home: PathBuf,
}

impl Session {
    fn start(tag: &str) -> Session {
        Self::start_with(tag, "2025-06-18").0
    }

    /// A session whose client asked for protocol `version`; also the
    /// server's initialize reply.
    fn start_with(tag: &str, version: &str) -> (Session, Value) {
        Self::start_in(home(tag), version)
    }

    /// A server on the state directory `home` as it is (a client that
    /// comes back after another left).
    fn start_in(home: PathBuf, version: &str) -> (Session, Value) {
        // The server's working directory is the host directory its copies
        // may use (the default `--allow-host-path`): the test's files are
        // under the temporary directory.
        let mut child = Command::new(BIN)
            .args(["serve", "mcp", "--allow-secret", SECRET_NAME])
            .current_dir(std::env::temp_dir())
            .env("MICROAGENT_HOME", &home)
            .envs(testkit::shared_warm_dir().map(|w| ("MICROAGENT_WARM_DIR", w)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start microagent serve mcp");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // Stdout carries JSON-RPC and nothing else.
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
                assert_eq!(value["jsonrpc"], "2.0", "{line}");
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        let mut session = Session {
            stdin: child.stdin.take(),
            child,
            lines,
            notifications: Vec::new(),
            next_id: 1,
            home,
        };
        let id = session.next_id();
        session.send(&initialize(id, version));
        let init = session.response(id, Duration::from_secs(30));
        assert_eq!(init["result"]["serverInfo"]["name"], "microagent", "{init}");
        assert!(init["result"]["capabilities"]["tools"].is_object());
        session.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        (session, init)
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    /// Waits for the response to `id`, keeping notifications.
    fn response(&mut self, id: u64, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(msg) if msg["id"] == json!(id) => return msg,
                Ok(msg) if msg.get("id").is_none() => self.notifications.push(msg),
                Ok(other) => panic!("unexpected message while waiting for {id}: {other}"),
                Err(RecvTimeoutError::Timeout) => panic!("no response to request {id}"),
                Err(RecvTimeoutError::Disconnected) => panic!("the server exited"),
            }
        }
    }

    /// Waits until a notification matches, at most `timeout`.
    fn notification(&mut self, timeout: Duration, matches: impl Fn(&Value) -> bool) -> Value {
        if let Some(n) = self.notifications.iter().find(|n| matches(n)) {
            return n.clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(msg) if msg.get("id").is_none() => {
                    self.notifications.push(msg.clone());
                    if matches(&msg) {
                        return msg;
                    }
                }
                Ok(other) => panic!("unexpected message: {other}"),
                Err(e) => panic!("no matching notification: {e}"),
            }
        }
    }

    /// Sends tools/call; returns the request id.
    fn call_async(&mut self, tool: &str, args: Value, progress_token: Option<&str>) -> u64 {
        let id = self.next_id();
        let mut params = json!({"name": tool, "arguments": args});
        if let Some(token) = progress_token {
            params["_meta"] = json!({"progressToken": token});
        }
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}));
        id
    }

    /// Calls a tool that must succeed; returns its structured content.
    fn ok(&mut self, tool: &str, args: Value) -> Value {
        self.ok_within(tool, args, Duration::from_secs(120))
    }

    /// [`Session::ok`] for a call that may take up to `timeout` (one that
    /// may boot a guest: minutes on an emulating host under load).
    fn ok_within(&mut self, tool: &str, args: Value, timeout: Duration) -> Value {
        let id = self.call_async(tool, args.clone(), None);
        let response = self.response(id, timeout);
        let result = &response["result"];
        assert_eq!(result["isError"], false, "{tool} {args}: {response}");
        assert!(result["content"][0]["text"].is_string(), "{response}");
        self.check_guests(tool, &result["structuredContent"]);
        result["structuredContent"].clone()
    }

    /// Fails with the console tail when a guest logged a process fault, or
    /// a command ended by a fault signal.
    fn check_guests(&self, tool: &str, result: &Value) {
        testkit::guest_faults::assert_no_faults_in(&self.home);
        let exited = if result.get("result").is_some() {
            &result["result"]
        } else {
            result
        };
        if let Some(signal) = exited["signal"].as_i64() {
            let console = testkit::guest_faults::workspace_consoles(&self.home)
                .into_iter()
                .map(|(_, c)| c)
                .collect::<Vec<_>>()
                .join("\n");
            testkit::guest_faults::assert_not_faulted(tool, i32::try_from(signal).ok(), &console);
        }
    }

    /// Closes stdin, checks that the server exits cleanly, and removes
    /// its state directory.
    fn close(self) {
        let home = self.disconnect();
        let _ = std::fs::remove_dir_all(home);
    }

    /// Closes stdin and checks that the server exits cleanly; the state
    /// directory (and any running workspace) stays.
    fn disconnect(mut self) -> PathBuf {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "exit status {status}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit after stdin closed"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.home.clone()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The file tools beyond read/write/list on the real guest: stat, mkdir,
/// edit (a wrong count changes nothing), lines, find, move, remove.
fn file_operations(s: &mut Session, name: &str) {
    let fails = |s: &mut Session, tool: &str, args: Value| -> String {
        let id = s.call_async(tool, args, None);
        let r = s.response(id, Duration::from_secs(60));
        assert_eq!(r["result"]["isError"], true, "{r}");
        r["result"]["structuredContent"]["code"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let missing = s.ok("file_stat", json!({"name": name, "path": "/tmp/nothing"}));
    assert_eq!(missing["exists"], false, "{missing}");
    s.ok(
        "file_mkdir",
        json!({"name": name, "path": "/tmp/ops/deep/er"}),
    );
    let dir = s.ok("file_stat", json!({"name": name, "path": "/tmp/ops/deep"}));
    assert_eq!(
        (dir["exists"].clone(), dir["stat"]["kind"].clone()),
        (json!(true), json!("dir")),
        "{dir}"
    );
    let text = "x = 1\ny = 2\nx = 3\n";
    s.ok(
        "file_write",
        json!({"name": name, "path": "/tmp/ops/a.py", "content": text, "mode": "0640"}),
    );
    // Twice where once was expected: a CONFLICT, and the file as it was.
    let code = fails(
        s,
        "file_edit",
        json!({"name": name, "path": "/tmp/ops/a.py", "old_text": "x = ", "new_text": "z = "}),
    );
    assert_eq!(code, "CONFLICT");
    let same = s.ok("file_read", json!({"name": name, "path": "/tmp/ops/a.py"}));
    assert_eq!(same["content"], text, "{same}");
    // A preview counts and writes nothing.
    let would = s.ok("file_edit", json!({"name": name, "path": "/tmp/ops/a.py", "old_text": "x = ", "new_text": "z = ", "expected_replacements": 2, "preview": true}));
    assert_eq!(
        (would["preview"].clone(), would["replacements"].clone()),
        (json!(true), json!(2)),
        "{would}"
    );
    let same = s.ok("file_read", json!({"name": name, "path": "/tmp/ops/a.py"}));
    assert_eq!(same["content"], text, "{same}");
    let edited = s.ok("file_edit", json!({"name": name, "path": "/tmp/ops/a.py", "old_text": "x = ", "new_text": "z = ", "expected_replacements": 2}));
    assert_eq!(edited["replacements"], 2, "{edited}");
    let stat = s.ok("file_stat", json!({"name": name, "path": "/tmp/ops/a.py"}));
    assert_eq!(stat["stat"]["mode"], "0640", "the mode stays: {stat}");
    let lines = s.ok(
        "file_read",
        json!({"name": name, "path": "/tmp/ops/a.py", "start_line": 2, "end_line": 3}),
    );
    assert_eq!(lines["content"], "y = 2\nz = 3\n", "{lines}");
    assert_eq!(lines["lines"]["total_lines"], 3, "{lines}");
    s.ok(
        "file_write",
        json!({"name": name, "path": "/tmp/ops/deep/er/b.py", "content": "pass\n"}),
    );
    let found = s.ok(
        "file_find",
        json!({"name": name, "path": "/tmp/ops", "pattern": "*.py"}),
    );
    assert_eq!(
        found["matches"],
        json!(["/tmp/ops/a.py", "/tmp/ops/deep/er/b.py"]),
        "{found}"
    );
    let would = s.ok(
        "file_move",
        json!({"name": name, "from": "/tmp/ops/a.py", "to": "/tmp/ops/deep/er/b.py", "preview": true}),
    );
    assert_eq!(
        would["action"],
        "would move file /tmp/ops/a.py to /tmp/ops/deep/er/b.py, replacing the file there",
        "{would}"
    );
    let kept = s.ok("file_stat", json!({"name": name, "path": "/tmp/ops/a.py"}));
    assert_eq!(kept["exists"], true, "a preview moves nothing: {kept}");
    s.ok(
        "file_move",
        json!({"name": name, "from": "/tmp/ops/a.py", "to": "/tmp/ops/c.py"}),
    );
    assert_eq!(
        fails(
            s,
            "file_remove",
            json!({"name": name, "path": "/tmp/ops/deep"})
        ),
        "INVALID_INPUT"
    );
    let preview = s.ok(
        "file_remove",
        json!({"name": name, "path": "/tmp/ops", "recursive": true, "preview": true}),
    );
    assert_eq!(preview["preview"], true, "{preview}");
    let still = s.ok("file_stat", json!({"name": name, "path": "/tmp/ops/c.py"}));
    assert_eq!(still["exists"], true, "a preview removes nothing: {still}");
    s.ok(
        "file_remove",
        json!({"name": name, "path": "/tmp/ops", "recursive": true}),
    );
    let gone = s.ok("file_stat", json!({"name": name, "path": "/tmp/ops"}));
    assert_eq!(gone["exists"], false, "{gone}");
}

fn sleeps(ps: &Value) -> bool {
    ps["stdout"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("sleep 600"))
}

#[test]
fn a_real_workspace_over_stdio() {
    let test = "mcp_stdio::a_real_workspace_over_stdio";
    if testkit::require(test, testkit::guest_assets()).is_none()
        || testkit::require(test, testkit::workspace_image("minimal")).is_none()
    {
        return;
    }
    let began = Instant::now();
    let mut s = Session::start("vm");
    let name = "mcp-e2e";
    let created = s.ok(
        "workspace_create",
        json!({"name": name, "image": "minimal"}),
    );
    assert_eq!(created["state"], "stopped");

    let id = s.call_async("workspace_start", json!({"name": name}), Some("boot"));
    let started = s.response(id, Duration::from_secs(330));
    assert_eq!(started["result"]["isError"], false, "{started}");
    assert_eq!(started["result"]["structuredContent"]["state"], "running");
    let boot_progress = s
        .notifications
        .iter()
        .filter(|n| n["params"]["progressToken"] == "boot")
        .count();
    eprintln!(
        "booted in {:.1} s with {boot_progress} progress notifications",
        began.elapsed().as_secs_f64()
    );

    let uname = s.ok(
        "workspace_exec",
        json!({"name": name, "command": ["uname", "-a"]}),
    );
    assert_eq!(uname["exit_code"], 0, "{uname}");
    assert!(
        uname["stdout"].as_str().unwrap().starts_with("Linux"),
        "{uname}"
    );

    secrets_reach_the_command_only(&mut s, name);

    // A background process, started here and collected by a client of a
    // new server process after this one has gone.
    let started = s.ok(
        "process_start",
        json!({"name": name, "shell": "sleep 30; echo done"}),
    );
    assert_eq!(started["state"], "running", "{started}");
    let process = started["id"].as_str().unwrap().to_owned();
    // A preview names the process and signals nothing (it still exits 0
    // below, after its sleep).
    let would = s.ok(
        "process_signal",
        json!({"name": name, "id": process, "signal": "KILL", "preview": true}),
    );
    let action = would["action"].as_str().unwrap_or_default();
    assert!(action.starts_with("would send KILL"), "{would}");
    let asked = s.call_async(
        "process_signal",
        json!({"name": name, "id": "proc-nope", "preview": true}),
        None,
    );
    let nope = s.response(asked, Duration::from_secs(30));
    assert_eq!(
        nope["result"]["structuredContent"]["code"], "NOT_FOUND",
        "{nope}"
    );

    let wrote = s.ok(
        "file_write",
        json!({"name": name, "path": "/tmp/hello.txt", "content": "hello from mcp\n"}),
    );
    assert_eq!(wrote["bytes"], 15, "{wrote}");
    let read = s.ok("file_read", json!({"name": name, "path": "/tmp/hello.txt"}));
    assert_eq!(read["content"], "hello from mcp\n", "{read}");
    assert_eq!(read["eof"], true);
    file_operations(&mut s, name);

    // Copies both ways.
    let files = PathBuf::from(format!("/tmp/mcp-{}-files", std::process::id()));
    let _ = std::fs::remove_dir_all(&files);
    std::fs::create_dir_all(files.join("src")).unwrap();
    std::fs::write(files.join("src/a.txt"), "copied in\n").unwrap();
    std::fs::create_dir_all(files.join("src/.git")).unwrap();
    std::fs::write(files.join("src/.git/config"), "[core]\n").unwrap();
    let src = files.join("src");
    let preview = s.ok(
        "copy_in",
        json!({"name": name, "host_path": src, "guest_path": "/tmp/src", "preview": true}),
    );
    assert_eq!(preview["preview"], true, "{preview}");
    let listed = s.ok("file_list", json!({"name": name, "path": "/tmp"}));
    assert!(
        !listed.to_string().contains("\"src\""),
        "a preview copies nothing: {listed}"
    );
    let copied = s.ok(
        "copy_in",
        json!({"name": name, "host_path": src, "guest_path": "/tmp/src"}),
    );
    assert_eq!(
        copied["transferred"], 4,
        "the directory, a.txt, .git and .git/config: {copied}"
    );
    let listed = s.ok("file_list", json!({"name": name, "path": "/tmp/src"}));
    assert!(
        listed["entries"].to_string().contains("\"a.txt\""),
        "{listed}"
    );
    // Git metadata comes back only when asked for.
    let back = files.join("back");
    let copied = s.ok(
        "copy_out",
        json!({"name": name, "guest_path": "/tmp/src", "host_path": back}),
    );
    assert_eq!(copied["left_out"], json!([".git"]), "{copied}");
    assert_eq!(copied["left_out_entries"], 2, "{copied}");
    assert!(back.join("a.txt").is_file() && !back.join(".git").exists());
    // Into the hooks of a host checkout: refused.
    std::fs::create_dir_all(back.join(".git/hooks")).unwrap();
    let hook = back.join(".git/hooks/pre-commit");
    let id = s.call_async(
        "copy_out",
        json!({"name": name, "guest_path": "/tmp/src/a.txt", "host_path": hook}),
        None,
    );
    let refused = s.response(id, Duration::from_secs(60));
    assert_eq!(
        refused["result"]["structuredContent"]["code"], "FORBIDDEN",
        "{refused}"
    );
    assert!(!hook.exists());
    let copied = s.ok(
        "copy_out",
        json!({"name": name, "guest_path": "/tmp/src", "host_path": back,
               "overwrite": true, "include_git_metadata": true}),
    );
    assert!(copied.get("left_out").is_none(), "{copied}");
    assert_eq!(
        std::fs::read_to_string(back.join(".git/config")).unwrap(),
        "[core]\n"
    );
    let out = files.join("out.txt");
    s.ok(
        "copy_out",
        json!({"name": name, "guest_path": "/tmp/src/a.txt", "host_path": out}),
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "copied in\n");
    let id = s.call_async(
        "copy_out",
        json!({"name": name, "guest_path": "/tmp/hello.txt", "host_path": out}),
        None,
    );
    let refused = s.response(id, Duration::from_secs(60));
    assert_eq!(
        refused["result"]["structuredContent"]["code"], "CONFLICT",
        "{refused}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "copied in\n");
    // Outside the server's directory: refused, nothing written.
    let id = s.call_async(
        "copy_out",
        json!({"name": name, "guest_path": "/tmp/hello.txt", "host_path": "/etc/microagent-copy-test"}),
        None,
    );
    let refused = s.response(id, Duration::from_secs(60));
    assert_eq!(
        refused["result"]["structuredContent"]["code"], "FORBIDDEN",
        "{refused}"
    );
    assert!(!std::path::Path::new("/etc/microagent-copy-test").exists());
    std::fs::remove_dir_all(&files).unwrap();

    let home = s.disconnect();
    let mut s = Session::start_in(home, "2025-06-18").0;
    let listed = s.ok("process_list", json!({"name": name}));
    assert!(
        listed["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"] == process.as_str()),
        "{listed}"
    );
    let waited = s.ok(
        "process_wait",
        json!({"name": name, "id": process, "timeout_secs": 100}),
    );
    assert_eq!(waited["state"], "exited", "{waited}");
    assert_eq!(waited["exit_code"], 0, "{waited}");
    let out = s.ok("process_output", json!({"name": name, "id": process}));
    assert_eq!(out["stdout"], "done\n", "{out}");
    assert_eq!(out["stdout_cursor"], 5, "{out}");
    assert_eq!(out["finished"], true, "{out}");

    // A long command, cancelled: its process must be gone.
    let id = s.call_async(
        "workspace_exec",
        json!({"name": name, "command": ["sleep", "600"]}),
        Some("sleep"),
    );
    s.notification(Duration::from_secs(30), |n| {
        n["method"] == "notifications/progress" && n["params"]["progressToken"] == "sleep"
    });
    let ps = s.ok("workspace_exec", json!({"name": name, "command": ["ps"]}));
    assert!(sleeps(&ps), "sleep 600 runs before the cancel: {ps}");
    s.send(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": id, "reason": "test"}}),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ps = s.ok("workspace_exec", json!({"name": name, "command": ["ps"]}));
        if !sleeps(&ps) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sleep 600 survived the cancel: {ps}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let events = s.ok("workspace_events", json!({"name": name}));
    assert!(
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "exec_finished" && e["signal"] == 9),
        "{events}"
    );

    // A snapshot, with progress asked for; a fork of it that resumes with
    // the file written before and its own hostname; a live fork; cleanup.
    let id = s.call_async(
        "snapshot_take",
        json!({"workspace": name, "name": "mcp-snap"}),
        Some("snap"),
    );
    let taken = s.response(id, Duration::from_secs(120));
    assert_eq!(
        taken["result"]["structuredContent"]["has_memory"], true,
        "{taken}"
    );
    let forked = s.ok(
        "workspace_fork",
        json!({"name": name, "new_name": "mcp-fork", "snapshot": "mcp-snap"}),
    );
    assert_eq!(forked["state"], "running", "{forked}");
    let host = s.ok(
        "workspace_exec",
        // One string as `command` is a command line, as `shell` is.
        json!({"name": "mcp-fork", "command": "hostname; cat /tmp/hello.txt"}),
    );
    assert_eq!(host["stdout"], "mcp-fork\nhello from mcp\n", "{host}");
    let restore_preview = s.ok(
        "snapshot_restore",
        json!({"name": "mcp-snap", "preview": true}),
    );
    assert_eq!(restore_preview["preview"], true, "{restore_preview}");
    // A new workspace by default, named after the snapshot's workspace.
    let action = restore_preview["action"].as_str().unwrap_or_default();
    assert!(
        action.contains(&format!("would start new workspace `{name}-restored`")),
        "{restore_preview}"
    );
    let in_place = s.ok(
        "snapshot_restore",
        json!({"name": "mcp-snap", "in_place": true, "preview": true}),
    );
    let action = in_place["action"].as_str().unwrap_or_default();
    assert!(
        action.contains(&format!("would put workspace `{name}` back")),
        "{in_place}"
    );
    let listed = s.ok("snapshot_list", json!({"workspace": name}));
    assert_eq!(listed["count"], 1, "{listed}");
    s.ok("snapshot_delete", json!({"name": "mcp-snap"}));
    s.ok(
        "workspace_delete",
        json!({"name": "mcp-fork", "force": true}),
    );

    let preview = s.ok(
        "workspace_delete",
        json!({"name": name, "force": true, "preview": true}),
    );
    assert_eq!(preview["preview"], true);
    assert_eq!(
        s.ok("workspace_inspect", json!({"name": name}))["state"],
        "running"
    );
    s.ok("workspace_delete", json!({"name": name, "force": true}));
    let listed = s.ok("workspace_list", json!({}));
    assert_eq!(listed["count"], 0, "{listed}");

    // `run`: a one-shot workspace, files written first, then gone.
    let ran = s.ok(
        "run",
        json!({"shell": "cat /tmp/in.txt; echo $GREETING", "env": {"GREETING": "hi"},
               "files": [{"path": "/tmp/in.txt", "content": "from a file\n"}]}),
    );
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert_eq!(ran["stdout"], "from a file\nhi\n", "{ran}");
    let listed = s.ok("workspace_list", json!({}));
    assert_eq!(listed["count"], 0, "run left nothing behind: {listed}");
    s.close();
    eprintln!(
        "a_real_workspace_over_stdio took {:.1} s",
        began.elapsed().as_secs_f64()
    );
}

#[test]
fn run_code_in_a_one_shot_debian_workspace() {
    let test = "mcp_stdio::run_code_in_a_one_shot_debian_workspace";
    if testkit::require(test, testkit::guest_assets()).is_none()
        || testkit::require(test, testkit::workspace_image("debian")).is_none()
    {
        return;
    }
    let began = Instant::now();
    let mut s = Session::start("py");
    // The image's unprivileged user is there too (uid 1000). The code
    // also writes a PNG (zlib and struct, no plotting library) and a text
    // file, which come back as content.
    let code = r"import os, pwd, struct, sys, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
rows = b''.join(b'\x00' + bytes([255, 0, 0] * 4) for _ in range(4))
png = b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 4, 4, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b'')
os.makedirs('/tmp/out', exist_ok=True)
open('/tmp/out/plot.png', 'wb').write(png)
open('/tmp/out/notes.txt', 'w').write('done\n')
print(sum(range(10)))
print(sys.stdin.read().strip().upper())
print(pwd.getpwnam('user').pw_uid)
print(png.hex())
sys.exit(3)";
    let id = s.call_async(
        "run_code",
        json!({"code": code, "stdin": "abc",
               "outputs": ["/tmp/out/*.png", "/tmp/out/notes.txt", "/tmp/none/*.csv"]}),
        Some("py"),
    );
    let ran = s.response(id, Duration::from_secs(600));
    let result = &ran["result"]["structuredContent"];
    assert_eq!(ran["result"]["isError"], false, "{ran}");
    assert_eq!(result["one_shot"], true);
    assert_eq!(result["exit_code"], 3, "{ran}");
    let stdout = result["stdout"].as_str().unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[..3], ["45", "ABC", "1000"], "{ran}");
    // The PNG as image content, byte for byte; the text inline.
    let content = ran["result"]["content"].as_array().unwrap();
    let image = content
        .iter()
        .find(|c| c["type"] == "image")
        .unwrap_or_else(|| panic!("no image content: {ran}"));
    assert_eq!(image["mimeType"], "image/png");
    use base64::Engine;
    let png = base64::engine::general_purpose::STANDARD
        .decode(image["data"].as_str().unwrap())
        .unwrap();
    let hex: String = png.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, lines[3], "the PNG came back byte for byte");
    let text = content
        .iter()
        .find(|c| c["type"] == "resource")
        .unwrap_or_else(|| panic!("no embedded resource: {ran}"));
    assert_eq!(text["resource"]["text"], "done\n", "{text}");
    assert_eq!(result["outputs"].as_array().unwrap().len(), 2, "{result}");
    assert_eq!(result["unmatched_outputs"], json!(["/tmp/none/*.csv"]));
    assert!(
        s.notifications
            .iter()
            .any(|n| n["params"]["progressToken"] == "py"),
        "progress was reported"
    );
    // The second one-shot of the image resumes its warm snapshot (or,
    // when the first could not keep one, boots: give it the boot's time).
    let js = s.ok_within(
        "run_code",
        json!({"language": "javascript", "code": "console.log([1, 2, 3].map(x => x * 7).join(','))"}),
        Duration::from_secs(600),
    );
    assert_eq!(js["language"], "javascript", "{js}");
    assert_eq!(js["exit_code"], 0, "{js}");
    assert_eq!(js["stdout"], "7,14,21\n", "{js}");
    let listed = s.ok("workspace_list", json!({}));
    assert_eq!(
        listed["count"], 0,
        "the one-shot workspaces are gone: {listed}"
    );
    s.close();
    eprintln!(
        "run_code_in_a_one_shot_debian_workspace took {:.1} s",
        began.elapsed().as_secs_f64()
    );
}
