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

    // Snapshot and fork on the same server.
    here.ok(&["snapshot", "take", "w1", "s1"]);
    let snaps = there.ok_json(&["snapshot", "ls", "--workspace", "w1", "--json"]);
    assert!(snaps.to_string().contains("s1"), "{snaps}");
    here.ok(&["fork", "w1", "w2"]);
    assert_eq!(
        here.ok(&["exec", "w2", "--", "cat", "/tmp/payload.txt"])
            .stdout,
        "payload over ssh\n"
    );
    let status = here.ok_json(&["server", "status", "remote1", "--json"]);
    let there_names: Vec<&str> = status["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(there_names, ["w1", "w2"], "{status}");
    assert_eq!(status["workspaces"][0]["state"], "running");
    here.ok(&["delete", "w2", "--yes", "--force"]);
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
    // a command in the remote workspace, a create placed there.
    if testkit::require(test, testkit::mcp_python()).is_some() {
        let spec = serde_json::json!({
            "stdio": [BIN, "serve", "mcp"],
            "env": {"MICROAGENT_HOME": here.home()},
            "calls": [
                {"tool": "server_list", "args": {}},
                {"tool": "workspace_exec", "args": {"name": "w1", "shell": "echo via-mcp; exit 4"}},
                {"tool": "workspace_create", "args": {"name": "w4", "server": "remote1"}},
                {"tool": "workspace_metrics", "args": {"server": "remote1"}},
            ],
        });
        let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_http/client.py");
        let answer = testkit::mcp_python_run(client, spec).unwrap();
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
    assert_eq!(out.status.code(), Some(255), "{out:?}");
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
    assert_eq!(refused.status, 255, "{}", refused.stderr);
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
