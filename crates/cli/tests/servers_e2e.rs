//! A pool of two servers on one machine: this host (`local`) and a
//! "remote" one reached through Debian's OpenSSH server on a loopback
//! port, with a key the test makes and a second state directory as the
//! remote host's. One guest boots, on the remote; every command on it goes
//! through ssh and acts on the remote state directory only.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use testkit::cli::CliHome;
use testkit::sshd::Sshd;

const BIN: &str = env!("CARGO_BIN_EXE_microagent");

fn can_run(test: &str) -> bool {
    testkit::require(test, testkit::sshd::missing().map_or(Ok(()), Err)).is_some()
        && testkit::require(test, testkit::guest_assets()).is_some()
        && testkit::require(test, testkit::workspace_image("minimal")).is_some()
        && testkit::require(test, testkit::host_tool("mkfs.ext4")).is_some()
}

fn names(list: &serde_json::Value) -> Vec<(String, String, String)> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap_or("").to_owned(),
                w["server"].as_str().unwrap_or("").to_owned(),
                w["state"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// The body of `GET /` from 127.0.0.1:`port`.
fn http_get(port: u16) -> std::io::Result<String> {
    use std::io::Read;
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
    // The first TCP connection a fresh guest makes costs 8-10 s of
    // emulated kernel work here (measured: even a refused one), then ~1 s.
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    conn.write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    if text.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(text)
}

/// `exec` on `ws` (placed on a server) hands on output as it comes, and
/// an interrupt here kills the command there.
fn output_streams_and_ctrl_c_kills_there(here: &CliHome, ws: &str) {
    use std::io::BufRead;
    let line = "echo first; exec sleep 300";
    let mut exec = here
        .command(&["exec", ws, "--shell", "--", line])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut out = std::io::BufReader::new(exec.stdout.take().unwrap());
    out.read_line(&mut first).unwrap();
    assert_eq!(first, "first\n");
    assert!(
        exec.try_wait().unwrap().is_none(),
        "exec ended before its command"
    );
    // SAFETY: kill only sends a signal, to the child this test spawned.
    unsafe { libc::kill(exec.id() as i32, libc::SIGINT) };
    let ended = exec.wait_with_output().unwrap();
    assert_eq!(ended.status.code(), Some(130), "{ended:?}");
    let left = here.ok(&[
        "exec",
        ws,
        "--shell",
        "--",
        "ps | grep -c '[s]leep 300' || true",
    ]);
    assert_eq!(
        left.stdout.trim(),
        "0",
        "the command outlived its interrupt"
    );
}

/// The CLI's per-workspace commands on `ws`, a running workspace placed on
/// a server that holds `/tmp/payload.txt`: inspect, TTL, metrics, logs,
/// events, processes, file operations, ports.
fn handle_calls_reach_the_server(here: &testkit::cli::CliHome, ws: &str) {
    let info = here.ok_json(&["inspect", ws, "--json"]);
    assert_eq!(
        (&info["name"], &info["state"]),
        (&ws.into(), &"running".into())
    );
    let ttl = here.ok_json(&["ttl", ws, "2h", "--json"]);
    assert_eq!(ttl["spec"]["ttl_secs"], 7200, "{ttl}");
    let ttl = here.ok_json(&["ttl", ws, "1h", "--extend", "--json"]);
    assert_eq!(ttl["spec"]["ttl_secs"], 10800, "{ttl}");
    let metrics = here.ok_json(&["metrics", ws, "--json"]);
    assert!(metrics.to_string().contains(ws), "{metrics}");
    // A fork's console may hold nothing yet: the call is what is checked.
    here.ok(&["logs", ws, "--lines", "5"]);
    let events = here.ok(&["events", ws]).stdout;
    assert!(events.contains("exec_finished"), "{events}");
    let ps = here.ok_json(&["ps", ws, "--json"]);
    assert!(ps["processes"].is_array(), "{ps}");

    here.ok(&["fs", "mkdir", ws, "/tmp/moved"]);
    here.ok(&["fs", "mv", ws, "/tmp/payload.txt", "/tmp/moved/p.txt"]);
    here.ok(&[
        "fs",
        "edit",
        ws,
        "/tmp/moved/p.txt",
        "--old",
        "over ssh",
        "--new",
        "by call",
    ]);
    let stat = here.ok_json(&["fs", "stat", ws, "/tmp/moved/p.txt", "--json"]);
    assert_eq!(
        (&stat["exists"], &stat["size"]),
        (&true.into(), &16.into()),
        "{stat}"
    );
    let found = here.ok(&["fs", "find", ws, "/tmp/moved", "*.txt"]).stdout;
    assert_eq!(found.trim(), "/tmp/moved/p.txt");
    here.ok(&["fs", "rm", ws, "/tmp/moved", "--recursive"]);
    let gone = here.ok_json(&["fs", "stat", ws, "/tmp/moved", "--json"]);
    assert_eq!(gone["exists"], false, "{gone}");

    let ports = here.ok_json(&["port", "ls", ws, "--json"]);
    assert_eq!(ports["workspace"], ws, "{ports}");
}

#[test]
fn a_remote_server_runs_workspaces_over_ssh() {
    let test = "a_remote_server_runs_workspaces_over_ssh";
    if !can_run(test) {
        return;
    }
    let here = CliHome::new(BIN, "srvhere");
    let there = CliHome::new(BIN, "srvthere");
    let mut sshd = Sshd::start(&here.home().join("sshd"));
    let target = sshd.target();
    let key = sshd.client_key();
    let mut add = vec![
        "server".to_owned(),
        "add".into(),
        "remote1".into(),
        "--ssh".into(),
        target,
        "--identity".into(),
        key.display().to_string(),
        "--state-dir".into(),
        there.home().display().to_string(),
        "--remote-binary".into(),
        BIN.into(),
        "--json".into(),
    ];
    for option in sshd.client_options() {
        add.extend(["--ssh-option".into(), option]);
    }
    let add: Vec<&str> = add.iter().map(String::as_str).collect();
    let added = here.ok_json(&add);
    assert_eq!(added["status"], "online", "{added}\n{}", sshd.log());
    assert!(added["resources"]["total_cpus"].as_u64().unwrap() > 0);
    assert_eq!(
        here.run(&add).error_code(),
        "CONFLICT",
        "a second add of one name"
    );

    let listed = here.ok_json(&["server", "ls", "--json"]);
    let servers: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(servers, ["local", "remote1"]);
    assert_eq!(listed[1]["health"]["ssh"], true);
    assert_eq!(listed[1]["health"]["kvm"], true);

    // A workspace made there lives there only.
    let created = here.ok_json(&["create", "w1", "--server", "remote1", "--json"]);
    assert_eq!(created["state"], "stopped");
    assert!(here.home().join("servers/placed/w1.json").exists());
    assert_eq!(there.ok_json(&["inspect", "w1", "--json"])["name"], "w1");
    assert!(!here.home().join("workspaces/w1").exists());
    let began = Instant::now();
    here.ok_json(&["start", "w1", "--json"]);
    eprintln!("remote start: {:.1} s", began.elapsed().as_secs_f64());

    // exec: stdin in, output and exit status back.
    let mut exec = here
        .command(&[
            "exec",
            "w1",
            "--stdin",
            "--",
            "sh",
            "-c",
            "cat; echo err >&2; exit 3",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    exec.stdin
        .take()
        .unwrap()
        .write_all(b"through ssh\n")
        .unwrap();
    let out = exec.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "through ssh\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err"));

    // exec streams: its first line is here while the command still runs
    // there, and Ctrl-C here kills it there.
    output_streams_and_ctrl_c_kills_there(&here, "w1");

    // A command on a terminal there (`exec -t`, as `shell` runs): keys
    // and sizes go as frames after the call, the pty's output comes back.
    let mut tty = here
        .command(&[
            "exec",
            "-t",
            "--stdin",
            "w1",
            "--shell",
            "--",
            "read x; echo got-$x; stty size; tty",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    tty.stdin.take().unwrap().write_all(b"typed\n").unwrap();
    let out = tty.wait_with_output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown} {out:?}");
    for line in ["got-typed\r\n", "24 80\r\n", "/dev/pts/"] {
        assert!(shown.contains(line), "{line:?} in {shown:?}");
    }

    // cp both ways.
    let file = here.home().join("payload.txt");
    std::fs::write(&file, "payload over ssh\n").unwrap();
    here.ok(&["cp", file.to_str().unwrap(), "w1:/tmp/payload.txt"]);
    let back = here.home().join("back.txt");
    here.ok(&["cp", "w1:/tmp/payload.txt", back.to_str().unwrap()]);
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "payload over ssh\n"
    );
    // A directory both ways, through the workspace's calls: its bytes
    // follow the call in and come back as frames, unpacked here through the
    // same checks as a local guest's (git metadata left out).
    let tree = here.home().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::create_dir_all(tree.join(".git")).unwrap();
    std::fs::write(tree.join("sub/b.txt"), "deep\n").unwrap();
    std::fs::write(tree.join(".git/config"), "[core]\n").unwrap();
    here.ok(&["cp", tree.to_str().unwrap(), "w1:/tmp/tree"]);
    let tree_back = here.home().join("tree-back");
    let preview = here.ok(&[
        "cp",
        "--preview",
        "w1:/tmp/tree",
        tree_back.to_str().unwrap(),
    ]);
    assert!(
        preview
            .stdout
            .starts_with("would copy guest dir w1:/tmp/tree"),
        "{}",
        preview.stdout
    );
    assert!(!tree_back.exists(), "a preview copies nothing");
    let copied = here.ok_json(&["cp", "w1:/tmp/tree", tree_back.to_str().unwrap(), "--json"]);
    assert_eq!(copied["left_out"][0], ".git", "{copied}");
    assert_eq!(
        std::fs::read_to_string(tree_back.join("sub/b.txt")).unwrap(),
        "deep\n"
    );
    assert!(!tree_back.join(".git").exists());

    // Snapshot and fork on the same server.
    here.ok(&["snapshot", "take", "w1", "s1"]);
    let snaps = there.ok_json(&["snapshot", "ls", "--workspace", "w1", "--json"]);
    assert!(snaps.to_string().contains("s1"), "{snaps}");
    // Listed from here, by a call of the workspace's handle: the same.
    let listed = here.ok_json(&["snapshot", "ls", "--workspace", "w1", "--json"]);
    assert_eq!(listed, snaps);
    here.ok(&["fork", "w1", "w2"]);
    assert_eq!(
        here.ok(&["exec", "w2", "--", "cat", "/tmp/payload.txt"])
            .stdout,
        "payload over ssh\n"
    );
    // Every other per-workspace command is a call of the workspace's
    // handle, which goes to the server by itself (no ssh of this terminal):
    // what it prints is what it prints for a workspace here.
    handle_calls_reach_the_server(&here, "w2");
    let status = here.ok_json(&["server", "status", "remote1", "--json"]);
    let there_names: Vec<&str> = status["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(there_names, ["w1", "w2"], "{status}");
    assert_eq!(status["workspaces"][0]["state"], "running");
    let halted = here.ok_json(&["halt", "w2", "--json"]);
    assert_eq!(halted["state"], "stopped", "{halted}");
    here.ok(&["delete", "w2", "--yes"]);
    assert!(!here.home().join("servers/placed/w2.json").exists());

    // A port the server publishes, forwarded here over SSH on request (the
    // server publishes on 127.0.0.2: both hosts are this machine).
    let serve = "mkdir -p /root/www && echo from-the-remote > /root/www/index.html \
                 && httpd -p 127.0.0.1:8080 -h /root/www";
    here.ok(&["exec", "w1", "--shell", "--", serve]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let published = format!("127.0.0.2:{port}:8080");
    here.ok(&["port", "add", "w1", &published, "--forward"]);
    let page = http_get(port).unwrap();
    assert!(page.ends_with("from-the-remote\n"), "{page}");
    here.ok(&["port", "rm", "w1", &format!("127.0.0.2:{port}")]);
    assert!(
        testkit::wait_until(Duration::from_secs(5), || http_get(port).is_err()),
        "the forward outlived port rm"
    );

    // list merges: the remote workspace, with its server.
    let merged = names(&here.ok_json(&["list", "--json"]));
    assert_eq!(merged, [("w1".into(), "remote1".into(), "running".into())]);

    // Through MCP, with the official Python SDK over stdio: the servers,
    // a command in the remote workspace, a create placed there; then an
    // agent's workspace placed there and started, and every per-workspace
    // tool on it (the handle's calls go to the server); another agent's
    // calls on it are FORBIDDEN.
    if testkit::require(test, testkit::mcp_python()).is_some() {
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
                serde_json::json!({"name": "alpha"}),
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
                    serde_json::json!({"host_path": tree.to_str().unwrap(), "guest_path": "/tmp/t5"}),
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
            call("agent_register", serde_json::json!({"name": "alpha"})),
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
            call("agent_register", serde_json::json!({"name": "beta"})),
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
    }

    // The connection cut mid-exec: a clear end within the keepalive
    // deadline, not a hang; the workspace is still there.
    let began = Instant::now();
    let cut = here
        .command(&["exec", "w1", "--", "sleep", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    sshd.kill_sessions();
    let out = cut.wait_with_output().unwrap();
    let waited = began.elapsed();
    // microagent's own failure (HOST_UNSUPPORTED), not the command's.
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("HOST_UNSUPPORTED"));
    assert!(waited < Duration::from_secs(40), "{waited:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("server remote1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let merged = names(&here.ok_json(&["list", "--json"]));
    assert_eq!(merged, [("w1".into(), "remote1".into(), "running".into())]);

    // The server down: offline, its workspace unknown; then back.
    sshd.stop();
    let listed = here.ok_json(&["server", "ls", "--json"]);
    assert_eq!(listed[1]["status"], "offline", "{listed}");
    assert!(listed[1].get("resources").is_none());
    let merged = names(&here.ok_json(&["list", "--json"]));
    assert_eq!(merged, [("w1".into(), "remote1".into(), "unknown".into())]);
    let refused = here.run(&["exec", "w1", "--", "true"]);
    assert_eq!(refused.status, 125, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("HOST_UNSUPPORTED"),
        "{}",
        refused.stderr
    );
    // What still goes as argv over SSH ends as ssh does.
    let argv = here.run(&["--server", "remote1", "image", "ls"]);
    assert_eq!(argv.status, 255, "{}", argv.stderr);
    sshd.resume();

    // Placement without --server: this host's budget lets nothing more
    // run, so the remote one wins.
    std::fs::write(here.home().join("budget.json"), r#"{"max_running": 0}"#).unwrap();
    here.ok(&["create", "w3", "--json"]);
    assert_eq!(there.ok_json(&["inspect", "w3", "--json"])["name"], "w3");
    here.ok(&["delete", "w3", "--yes"]);

    assert_eq!(
        here.run(&["server", "rm", "remote1", "--json"])
            .error_code(),
        "CONFLICT",
        "w1 still lives there"
    );
    here.ok(&["delete", "w1", "--yes", "--force"]);
    // A placement whose create was cut short (the server never made it):
    // delete forgets it, and says the server has no such workspace.
    let ghost = here.home().join("servers/placed/ghost.json");
    std::fs::write(&ghost, r#"{"workspace":"ghost","server":"remote1"}"#).unwrap();
    let forgot = here.run(&["delete", "ghost", "--yes", "--json"]);
    assert_ne!(forgot.status, 0, "{}", forgot.stdout);
    assert!(forgot.stdout.contains("NOT_FOUND"), "{}", forgot.stdout);
    assert!(
        !ghost.exists(),
        "the placement of a workspace never made stays"
    );
    here.ok(&["--server", "remote1", "snapshot", "rm", "s1"]);
    assert!(there.vmm_pids().is_empty(), "a VMM is left on the remote");
    here.ok(&["server", "rm", "remote1"]);
    // Nothing of the workspaces is left there; the image's warm snapshot
    // (made by the first start) stays for the next one.
    assert!(testkit::leftovers::processes_of(there.home()).is_empty());
    assert!(testkit::leftovers::cgroups_of(there.home()).is_empty());
    let files: Vec<String> = testkit::leftovers::files_of(there.home())
        .into_iter()
        .filter(|f| f != "warm" && !f.starts_with("warm/"))
        .collect();
    assert!(files.is_empty(), "left on the remote: {files:?}");
}
