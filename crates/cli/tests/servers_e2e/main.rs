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

mod mcp;

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
    // devbox's `host`: this machine's name, the server's SSH host.
    assert!(
        listed[0]["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{listed}"
    );
    assert_eq!(listed[1]["host"], "127.0.0.1", "{listed}");
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
    let status = here.ok_json(&["server", "status", "remote1", "--usage", "--json"]);
    let there_names: Vec<&str> = status["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(there_names, ["w1", "w2"], "{status}");
    assert_eq!(status["workspaces"][0]["state"], "running");
    // Each workspace with what it uses, measured there (devbox's
    // per-workspace figures).
    let usage = &status["workspaces"][0]["usage"];
    assert!(usage["memory_used_bytes"].as_u64().unwrap() > 0, "{status}");
    assert!(
        usage["disk_allocated_bytes"].as_u64().unwrap() > 0,
        "{status}"
    );
    assert!(usage["net_rx_bytes"].is_u64(), "{status}");
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
        mcp::tools_reach_the_server(&here, &there);
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
