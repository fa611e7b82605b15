//! End to end through the `microagent` binary on the real guest kernel and
//! the `minimal` image. Each boot costs ~25 s on a host that emulates guest
//! kernel mode, so every test does as much as it can with one boot.

use std::time::{Duration, Instant};

use testkit::cli::CliHome;
use testkit::terminal::Terminal;

mod balloon;
mod confinement;
mod hibernate;
mod idle;
mod mcp_session;
mod pool;
mod services;
mod snapshots;
mod volumes;
mod watch;

/// Whether this host can boot workspaces; prints the reason and records a
/// skip when not.
fn can_boot(test: &str) -> bool {
    testkit::require(test, testkit::guest_assets()).is_some()
        && testkit::require(test, testkit::workspace_image("minimal")).is_some()
        && testkit::require(test, testkit::host_tool("mkfs.ext4")).is_some()
}

fn home(test: &str) -> CliHome {
    CliHome::new(env!("CARGO_BIN_EXE_microagent"), test)
}

fn events(cli: &CliHome, name: &str) -> Vec<String> {
    let run = cli.run(&["events", name, "--json"]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    run.stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

fn start(cli: &CliHome, name: &str) {
    let began = Instant::now();
    let started = cli.ok_json(&["start", name, "--json"]);
    assert_eq!(started["state"], "running");
    eprintln!("{name} started in {:.1} s", began.elapsed().as_secs_f64());
}

/// An HTTP server on the host's loopback (an ephemeral port) answering
/// every request with `body`, for the rest of the test process.
struct HostHttp {
    port: u16,
}

impl HostHttp {
    fn serve(body: &'static str) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                // The whole request first: closing on unread bytes would
                // reset the connection under the client.
                let mut request = Vec::new();
                let mut chunk = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut chunk) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&chunk[..n]),
                    }
                }
                let reply = format!(
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes());
                let _ = conn.shutdown(std::net::Shutdown::Write);
                let _ = conn.read_to_end(&mut request);
            }
        });
        Self { port }
    }
}

/// Bytes a guest uploads in the one-shot run: ~40 s on a host that
/// emulates guest kernel mode, past the reset of passt before 2023-03-27.
const UPLOAD_BYTES: usize = 2 << 20;

/// A server on the host's loopback that reads one connection up to
/// [`UPLOAD_BYTES`] (or its end) and reports how many bytes came; it then
/// closes, which also ends a client that waits for the peer (busybox nc).
fn upload_sink() -> (u16, std::sync::mpsc::Receiver<usize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Read;
        let Ok((mut conn, _)) = listener.accept() else {
            return;
        };
        let mut total = 0;
        let mut buf = [0u8; 64 << 10];
        while total < UPLOAD_BYTES {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        let _ = tx.send(total);
    });
    (port, rx)
}

/// A port of this machine's loopback that is free now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `GET /` on 127.0.0.1:`port`; the response, or why there is none.
fn host_get(port: u16) -> Result<String, std::io::Error> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port))?;
    // A guard against a hang, not a speed target: on a busy host each
    // connection through the guest takes seconds of emulated kernel work.
    c.set_read_timeout(Some(Duration::from_secs(120)))?;
    c.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n")?;
    let mut out = String::new();
    c.read_to_string(&mut out)?;
    Ok(out)
}

/// On the running `dev` (created with `--publish web_port:8080`): busybox
/// httpd on the guest's loopback answers on the host's, through the port
/// published at create and through one added while it runs; a removed one
/// stops listening.
fn published_ports(cli: &CliHome, web_port: u16) {
    let serve = "mkdir -p /root/www && echo from-the-guest > /root/www/index.html \
                 && httpd -p 127.0.0.1:8080 -h /root/www";
    assert_eq!(cli.run(&["exec", "dev", "--shell", "--", serve]).status, 0);
    let page = host_get(web_port).unwrap();
    assert!(page.ends_with("from-the-guest\n"), "{page}");
    let extra = free_port();
    let added = cli.ok_json(&["port", "add", "dev", &format!("{extra}:8080"), "--json"]);
    assert_eq!(added["ports"].as_array().unwrap().len(), 2, "{added}");
    assert!(host_get(extra).unwrap().ends_with("from-the-guest\n"));
    assert_eq!(
        cli.run(&["port", "add", "dev", &format!("{web_port}:9090"), "--json"])
            .error_code(),
        "INVALID_INPUT",
        "a host port published twice"
    );
    let removed = cli.ok_json(&["port", "rm", "dev", &extra.to_string(), "--json"]);
    assert_eq!(removed["ports"].as_array().unwrap().len(), 1, "{removed}");
    assert!(
        testkit::wait_until(Duration::from_secs(5), || host_get(extra).is_err()),
        "a removed port still answers"
    );
    assert_eq!(
        cli.run(&["port", "rm", "dev", &extra.to_string(), "--json"])
            .error_code(),
        "NOT_FOUND"
    );
    let listed = cli.ok_json(&["port", "ls", "dev", "--json"]);
    assert_eq!(listed["ports"][0]["guest_port"], 8080, "{listed}");
}

fn assert_no_leftovers(cli: &CliHome, name: &str) {
    // A VMM records its end as its last step; on a loaded host its exit
    // (its memory given back) may trail the record by a moment.
    assert!(
        testkit::wait_until(Duration::from_secs(10), || cli.vmm_pids().is_empty()),
        "a VMM process was left behind: {:?}",
        cli.vmm_pids()
    );
    let dir = cli.home().join("workspaces").join(name);
    for sock in ["control.sock", "vsock.sock"] {
        assert!(!dir.join(sock).exists(), "{sock} was left behind");
    }
    // The user network's passt ends with the VMM: at once on a stop, as
    // soon as it sees its socket close when the VMM was killed.
    let passt_log = dir.join("passt.log").to_string_lossy().into_owned();
    let passt_left = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(&passt_log))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !passt_left().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        passt_left().is_empty(),
        "passt was left running: {:?}",
        passt_left()
    );
}

#[test]
fn life_cycle_exec_files_logs_events() {
    let test = "life_cycle_exec_files_logs_events";
    if !can_boot(test) {
        return;
    }
    let cli = home("lifecycle");
    let web_port = free_port();
    // The host's loopback is closed to guests but for the ports a rule
    // opens (docs/networking.md).
    let server = HostHttp::serve("from the host's loopback\n");
    let host_rule = format!("host:{}", server.port);
    let created = cli.ok_json(&[
        "create",
        "dev",
        "--env",
        "GREETING=hi",
        "--label",
        "suite=e2e",
        "--publish",
        &format!("{web_port}:8080"),
        "--allow",
        &host_rule,
        "--json",
    ]);
    assert_eq!(created["state"], "stopped");
    assert_eq!(created["spec"]["ports"][0]["host_port"], web_port);
    start(&cli, "dev");
    assert_eq!(
        cli.run(&["start", "dev", "--json"]).error_code(),
        "CONFLICT"
    );
    // The VMM runs confined, and says so (docs/security.md).
    confinement::check(&cli, "dev");
    // File watches through MCP (docs/mcp.md).
    watch::check(&cli, "dev");

    let uname = cli.run(&["exec", "dev", "--", "uname", "-a"]);
    assert_eq!(uname.status, 0, "{}", uname.stderr);
    assert!(uname.stdout.starts_with("Linux dev "), "{}", uname.stdout);

    let exec = cli.ok_json(&[
        "exec",
        "dev",
        "--json",
        "--shell",
        "--",
        "echo $GREETING; echo oops >&2",
    ]);
    assert_eq!(exec["stdout"], "hi\n");
    assert_eq!(exec["stderr"], "oops\n");
    assert_eq!(
        cli.run(&["exec", "dev", "--shell", "--", "exit 7"]).status,
        7
    );
    assert_eq!(
        cli.run(&["exec", "dev", "--", "no-such-program"]).status,
        127
    );

    // Copies: a file and a directory in, both back out, byte for byte.
    let host = cli.home().join("host");
    std::fs::create_dir_all(host.join("tree/sub")).unwrap();
    std::fs::write(
        host.join("file.bin"),
        (0..70_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    std::fs::write(host.join("tree/sub/leaf.txt"), "leaf\n").unwrap();
    let p = |rel: &str| host.join(rel).to_str().unwrap().to_owned();
    cli.ok(&["cp", &p("file.bin"), "dev:/root/file.bin"]);
    cli.ok(&["cp", &p("tree"), "dev:/root/tree"]);
    let cat = cli.run(&["exec", "dev", "--", "cat", "/root/tree/sub/leaf.txt"]);
    assert_eq!(cat.stdout, "leaf\n");
    cli.ok(&["cp", "dev:/root/file.bin", &p("back.bin")]);
    assert_eq!(
        std::fs::read(p("back.bin")).unwrap(),
        std::fs::read(p("file.bin")).unwrap()
    );
    cli.ok(&["cp", "dev:/root/tree", &p("tree-back")]);
    assert_eq!(
        std::fs::read_to_string(p("tree-back/sub/leaf.txt")).unwrap(),
        "leaf\n"
    );
    // An existing host path only with --overwrite; --preview copies nothing.
    std::fs::write(p("back.bin"), b"stale").unwrap();
    assert_eq!(
        cli.run(&["cp", "dev:/root/file.bin", &p("back.bin"), "--json"])
            .error_code(),
        "CONFLICT"
    );
    let would = cli.ok_json(&[
        "cp",
        "dev:/root/file.bin",
        &p("back.bin"),
        "--overwrite",
        "--preview",
        "--json",
    ]);
    assert_eq!(would["preview"], true);
    let action = would["action"].as_str().unwrap();
    assert!(action.starts_with("would copy guest file"), "{action}");
    assert!(action.contains("replacing a host file of 5 B"), "{action}");
    assert_eq!(std::fs::read(p("back.bin")).unwrap(), b"stale");
    cli.ok(&["cp", "dev:/root/file.bin", &p("back.bin"), "--overwrite"]);
    assert_eq!(
        std::fs::read(p("back.bin")).unwrap(),
        std::fs::read(p("file.bin")).unwrap()
    );
    assert_eq!(
        cli.run(&["cp", "dev:/root/missing", &p("x"), "--json"])
            .error_code(),
        "NOT_FOUND"
    );

    let logs = cli.run(&["logs", "dev"]);
    assert!(
        logs.stdout.contains("Linux version"),
        "the console starts with the kernel banner"
    );
    assert!(logs.stdout.contains("microagent-agent: listening"));
    let tail = cli.ok_json(&["logs", "dev", "--lines", "1", "--json"]);
    assert_eq!(tail["lines"].as_array().unwrap().len(), 1);

    let listed = cli.ok_json(&["list", "--state", "running", "--json"]);
    assert_eq!(listed[0]["name"], "dev");
    assert_eq!(listed[0]["spec"]["network"], "user");

    // The host's loopback through the user network, by its name (glibc's
    // resolver is what crashed under host load before issue 10's fix), on
    // the port its rule opens.
    let url = format!("http://host.microagent.internal:{}/", server.port);
    let fetched = cli.run(&["exec", "dev", "--", "wget", "-qO-", &url]);
    assert_eq!(fetched.status, 0, "{}", fetched.stderr);
    assert_eq!(fetched.stdout, "from the host's loopback\n");
    egress_rules_change_at_once(&cli, &host_rule);
    let hosts = cli.run(&["exec", "dev", "--", "cat", "/etc/hosts"]);
    assert!(
        hosts
            .stdout
            .contains("10.0.2.2\thost.microagent.internal\n"),
        "{}",
        hosts.stdout
    );

    published_ports(&cli, web_port);
    terminal_sessions(&cli);
    background_processes(&cli);
    metrics_are_plausible(&cli);
    // The balloon is checked once, on a fork restored from a snapshot of
    // `dev` (snapshots.rs): the balloon `dev` booted with, carried through
    // a snapshot; a fill and free is a minute of emulated kernel work.
    snapshots::snapshots_and_forks(&cli, &url);

    let stopped = cli.ok_json(&["stop", "dev", "--json"]);
    assert_eq!(stopped["state"], "stopped");
    assert_eq!(stopped["last_exit"]["reason"], "stopped on request");
    assert_no_leftovers(&cli, "dev");
    assert!(
        std::net::TcpListener::bind(("127.0.0.1", web_port)).is_ok(),
        "the published port is free once the VMM ended"
    );
    assert_eq!(
        cli.run(&["exec", "dev", "--json", "--", "true"])
            .error_code(),
        "NOT_RUNNING"
    );
    // A shared warm snapshot made by an older build is discarded (and
    // logged) on the way; that is not this test's business.
    let kinds: Vec<String> = events(&cli, "dev")
        .into_iter()
        .filter(|k| k != "warm_snapshot_discarded")
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("created"));
    assert_eq!(kinds.get(1).map(String::as_str), Some("started"));
    assert!(kinds.iter().filter(|k| *k == "exec_started").count() >= 4);
    assert_eq!(
        kinds.iter().filter(|k| *k == "exec_started").count(),
        kinds.iter().filter(|k| *k == "exec_finished").count()
    );
    assert_eq!(kinds.last().map(String::as_str), Some("stopped"));

    let deleted = cli.ok_json(&["delete", "dev", "--yes", "--json"]);
    assert_eq!(deleted["deleted"], "dev");
    assert!(!cli.home().join("workspaces/dev").exists());
}

/// Another host port is refused at once (a reset, not a timeout), the
/// refusal is shown, and a rule added to the running workspace opens it
/// for the next connection.
fn egress_rules_change_at_once(cli: &CliHome, host_rule: &str) {
    let other = HostHttp::serve("the other host port\n");
    let url = format!("http://host.microagent.internal:{}/", other.port);
    let began = std::time::Instant::now();
    let refused = cli.run(&["exec", "dev", "--", "timeout", "20", "wget", "-qO-", &url]);
    assert_ne!(refused.status, 0, "{}", refused.stdout);
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "refused by a reset, not a timeout: {:?}",
        began.elapsed()
    );
    let policy = cli.ok_json(&["network", "policy", "dev", "--json"]);
    let denials = policy["denials"].as_array().expect("denials while it runs");
    assert!(
        denials
            .iter()
            .any(|d| d["port"] == other.port && d["dst"] == "10.0.2.2" && d["protocol"] == "tcp"),
        "{policy}"
    );
    // And as an event, within the second the VMM records them in.
    assert!(
        testkit::wait_until(Duration::from_secs(10), || events(cli, "dev")
            .iter()
            .any(|k| k == "egress_refused")),
        "{:?}",
        events(cli, "dev")
    );
    let other_rule = format!("host:{}", other.port);
    let changed = cli.ok_json(&[
        "network",
        "policy",
        "dev",
        "--allow",
        host_rule,
        "--allow",
        &other_rule,
        "--json",
    ]);
    assert_eq!(
        changed["allow"].as_array().map(Vec::len),
        Some(2),
        "{changed}"
    );
    let fetched = cli.run(&["exec", "dev", "--", "wget", "-qO-", &url]);
    assert_eq!(fetched.status, 0, "{}", fetched.stderr);
    assert_eq!(fetched.stdout, "the other host port\n");
    // The cloud metadata address is closed by default, whatever is there.
    let metadata = cli.run(&[
        "exec",
        "dev",
        "--",
        "timeout",
        "20",
        "wget",
        "-qO-",
        "http://169.254.169.254/",
    ]);
    assert_ne!(metadata.status, 0, "{}", metadata.stdout);
    let policy = cli.ok_json(&["network", "policy", "dev", "--json"]);
    assert!(
        policy["denials"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["dst"] == "169.254.169.254"),
        "{policy}"
    );
}

/// On the running `dev`, as a person at a terminal: `shell` gives a tty
/// whose keys reach the guest (Ctrl-C interrupts a command there, not
/// microagent), size changes follow, and the shell's status comes back.
fn terminal_sessions(cli: &CliHome) {
    let mut term = Terminal::spawn(cli.command(&["shell", "dev"]), 30, 100);
    term.type_text("tty; stty size; echo marker-$((6*7))\n");
    term.wait_for("marker-42", Duration::from_secs(60));
    let screen = term.screen();
    assert!(screen.contains("/dev/pts/"), "{screen}");
    assert!(screen.contains("30 100"), "{screen}");
    term.resize(40, 120);
    // The resize travels with the keys, ahead of what is typed after it.
    std::thread::sleep(Duration::from_secs(1));
    term.type_text("stty size\n");
    term.wait_for("40 120", Duration::from_secs(60));
    // Ctrl-C once the command runs: while the shell still reads its line (raw
    // mode; seconds on a busy host) it would be a plain byte.
    term.type_text("echo started-$((1+2)); sleep 100 && echo after-$((1+1))\n");
    term.wait_for("started-3", Duration::from_secs(60));
    // Ctrl-C once `sleep` runs: sent while the shell still forks it, the
    // shell holds the signal until its child ends (100 s later). Starting a
    // guest process takes seconds on a busy emulating host.
    assert!(
        testkit::wait_until(Duration::from_secs(60), || {
            cli.run(&[
                "exec",
                "dev",
                "--",
                "sh",
                "-c",
                "ps | grep -q '[s]leep 100'",
            ])
            .status
                == 0
        }),
        "sleep never ran: {}",
        term.screen()
    );
    term.type_text("\x03");
    term.type_text("echo alive-$((2+3))\n");
    term.wait_for("alive-5", Duration::from_secs(60));
    assert!(!term.screen().contains("after-2"), "{}", term.screen());
    term.type_text("exit 3\n");
    assert_eq!(term.wait_exit(Duration::from_secs(60)).code(), Some(3));

    // exec -t without -i: a tty, no input, the command's status.
    let mut term = Terminal::spawn(
        cli.command(&["exec", "-t", "dev", "--shell", "--", "test -t 1 && exit 4"]),
        24,
        80,
    );
    assert_eq!(term.wait_exit(Duration::from_secs(60)).code(), Some(4));
    assert_eq!(
        cli.run(&["exec", "-t", "dev", "--json", "--", "true"])
            .error_code(),
        "INVALID_INPUT"
    );
}

/// On the running `dev`: a detached command listed by `ps`, waited for and
/// read back through `process`, then forgotten.
fn background_processes(cli: &CliHome) {
    let started = cli.ok_json(&[
        "exec",
        "dev",
        "--detach",
        "--json",
        "--shell",
        "--",
        "echo begun; sleep 2; echo ended >&2; exit 5",
    ]);
    let id = started["id"].as_str().unwrap().to_owned();
    let listed = cli.ok_json(&["ps", "dev", "--json"]);
    assert!(
        listed["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"] == id.as_str()),
        "{listed}"
    );
    let waited = cli.run(&["process", "wait", "dev", &id, "--timeout", "60"]);
    assert_eq!(waited.status, 5, "{}", waited.stderr);
    let out = cli.ok_json(&["process", "output", "dev", &id, "--json"]);
    assert_eq!(out["stdout"], "begun\n", "{out}");
    assert_eq!(out["stderr"], "ended\n", "{out}");
    cli.ok(&["process", "rm", "dev", &id]);
    assert_eq!(
        cli.run(&["process", "output", "dev", &id, "--json"])
            .error_code(),
        "NOT_FOUND"
    );
}

/// On the running `dev`: guest and host figures that make sense.
fn metrics_are_plausible(cli: &CliHome) {
    let m = cli.ok_json(&["metrics", "dev", "--json"]);
    let n = |key: &str| m[key].as_f64().unwrap_or_else(|| panic!("{key}: {m}"));
    assert_eq!(m["state"], "running");
    let vcpus = n("vcpus");
    assert!((0.0..=100.0 * vcpus).contains(&n("cpu_percent")), "{m}");
    assert!(n("memory_used_bytes") > 0.0, "{m}");
    assert!(n("memory_used_bytes") < n("memory_total_bytes"), "{m}");
    assert!(n("host_rss_bytes") > 1e6, "{m}");
    assert!(n("disk_used_bytes") > 0.0, "{m}");
    assert!(
        n("disk_allocated_bytes") <= n("disk_size_bytes") + 1e6,
        "{m}"
    );
    assert!(n("uptime_secs") >= 0.0, "{m}");
    assert!(
        n("net_rx_bytes") > 0.0,
        "the guest fetched from the host: {m}"
    );
    let all = cli.ok_json(&["metrics", "--json"]);
    assert!(
        all.as_array().unwrap().iter().any(|w| w["name"] == "dev"),
        "{all}"
    );
    assert_eq!(
        cli.run(&["metrics", "nope", "--json"]).error_code(),
        "NOT_FOUND"
    );
}

#[test]
fn ttl_expiry_and_kill_9_detection() {
    let test = "ttl_expiry_and_kill_9_detection";
    if !can_boot(test) {
        return;
    }
    let cli = home("ttlcrash");
    cli.ok_json(&["create", "short", "--json"]);
    start(&cli, "short");
    // An extension moves the running deadline and lengthens later starts'.
    cli.ok_json(&["ttl", "short", "1h", "--json"]);
    let extended = cli.ok_json(&["ttl", "short", "30m", "--extend", "--json"]);
    assert_eq!(extended["spec"]["ttl_secs"], 5400, "{extended}");
    let info = cli.ok_json(&["inspect", "short", "--json"]);
    let left_ms =
        info["runtime"]["ttl_deadline_ms"].as_u64().unwrap() - workspace::host::settings::now_ms();
    assert!(
        (89 * 60_000..=90 * 60_000).contains(&left_ms),
        "{left_ms} ms left"
    );
    // A TTL set on the running workspace goes to its VMM, which enforces it.
    let set = cli.ok_json(&["ttl", "short", "2", "--json"]);
    assert_eq!(set["spec"]["ttl_secs"], 2);
    let stopped = cli.wait_state("short", "stopped", Duration::from_secs(60));
    assert!(
        stopped["last_exit"]["reason"]
            .as_str()
            .unwrap()
            .contains("TTL"),
        "{stopped}"
    );
    let kinds = events(&cli, "short");
    let expired = kinds
        .iter()
        .position(|k| k == "ttl_expired")
        .expect("a ttl_expired event");
    assert_eq!(kinds[expired + 1..], ["stopped".to_owned()]);
    assert_no_leftovers(&cli, "short");

    // The same workspace boots again; its VMM is then killed with SIGKILL.
    cli.ok_json(&["ttl", "short", "off", "--json"]);
    start(&cli, "short");
    let info = cli.ok_json(&["inspect", "short", "--json"]);
    let pid = info["runtime"]["pid"].as_i64().unwrap() as i32;
    // SAFETY: kill(2) with plain integers.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let crashed = cli.wait_state("short", "crashed", Duration::from_secs(10));
    assert!(crashed["last_exit"]["reason"]
        .as_str()
        .unwrap()
        .contains("died"));
    assert!(
        !crashed["last_exit"]["console_tail"]
            .as_array()
            .unwrap()
            .is_empty(),
        "a crash keeps the last console lines"
    );
    assert_eq!(
        events(&cli, "short").last().map(String::as_str),
        Some("crashed")
    );
    assert_eq!(
        cli.run(&["exec", "short", "--json", "--", "true"])
            .error_code(),
        "NOT_RUNNING"
    );
    assert_no_leftovers(&cli, "short");
    assert_eq!(cli.run(&["delete", "short", "--yes"]).status, 0);
}

#[test]
fn five_cycles_and_a_one_shot_run_leave_nothing_behind() {
    // The first cycle also stops its workspace with SIGTERM and starts it again.
    let test = "five_cycles_and_a_one_shot_run_leave_nothing_behind";
    if !can_boot(test) {
        return;
    }
    let cli = home("cycles");
    for i in 0..5 {
        let name = format!("cycle{i}");
        // One cycle has no network: a published port still answers (it is
        // tunnelled over vsock, not routed).
        let port = (i == 1).then(free_port);
        let publish = port.map(|p| format!("{p}:8080"));
        let mut create = vec!["create", &name, "--json"];
        if let Some(publish) = &publish {
            create.extend(["--network", "none", "--publish", publish]);
        }
        cli.ok_json(&create);
        start(&cli, &name);
        if let Some(port) = port {
            let serve = "mkdir -p /root/www && echo no-network > /root/www/index.html \
                         && httpd -p 127.0.0.1:8080 -h /root/www";
            assert_eq!(cli.run(&["exec", &name, "--shell", "--", serve]).status, 0);
            let page = host_get(port).unwrap();
            assert!(page.ends_with("no-network\n"), "{page}");
        }
        if i == 0 {
            // SIGTERM to the VMM (a host shutdown) is a graceful stop.
            let pid = cli.ok_json(&["inspect", &name, "--json"])["runtime"]["pid"]
                .as_i64()
                .unwrap() as i32;
            // SAFETY: kill(2) with plain integers.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
            let stopped = cli.wait_state(&name, "stopped", Duration::from_secs(60));
            assert_eq!(stopped["last_exit"]["reason"], "stopped by SIGTERM");
            assert_no_leftovers(&cli, &name);
            start(&cli, &name);
        }
        // A running workspace is only deleted on purpose.
        assert_eq!(
            cli.run(&["delete", &name, "--yes", "--json"]).error_code(),
            "CONFLICT"
        );
        cli.ok_json(&["delete", &name, "--yes", "--force", "--json"]);
        assert_no_leftovers(&cli, &name);
    }
    // The first-run example: a one-shot workspace reaches a server
    // on the host's loopback by name, with no setup; and an upload to a
    // silent peer outlives passt's old 24 s reset (docs/networking.md).
    let page = HostHttp::serve("from-the-host\n");
    let (sink_port, received) = upload_sink();
    let script = format!(
        "uname -s; wget -qO- http://host.microagent.internal:{}/; \
         head -c {UPLOAD_BYTES} /dev/zero | nc host.microagent.internal {sink_port}; exit 3",
        page.port
    );
    let (page_rule, sink_rule) = (format!("host:{}", page.port), format!("host:{sink_port}"));
    let run = cli.run(&[
        "run", "--name", "oneshot", "--allow", &page_rule, "--allow", &sink_rule, "--", "sh", "-c",
        &script,
    ]);
    assert_eq!(
        run.status, 3,
        "run exits with the command's status: {}",
        run.stderr
    );
    assert_eq!(run.stdout, "Linux\nfrom-the-host\n");
    let got = received.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(got, UPLOAD_BYTES, "the upload arrived whole");
    // A one-shot whose CLI is killed: its VMM stops with it, not at the TTL.
    let mut orphaned = cli
        .command(&["run", "--name", "orphan", "--", "sleep", "600"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let running = || {
        let r = cli.run(&["inspect", "orphan", "--json"]);
        r.status == 0 && r.json()["state"] == "running"
    };
    assert!(
        testkit::wait_until(Duration::from_secs(120), running),
        "the one-shot workspace came up"
    );
    orphaned.kill().unwrap();
    orphaned.wait().unwrap();
    let stopped = cli.wait_state("orphan", "stopped", Duration::from_secs(60));
    assert_eq!(
        stopped["last_exit"]["reason"], "the process it ran for ended",
        "{stopped}"
    );
    assert!(testkit::wait_until(Duration::from_secs(10), || cli
        .vmm_pids()
        .is_empty()));
    cli.ok_json(&["delete", "orphan", "--yes", "--json"]);
    assert!(cli.vmm_pids().is_empty());
    let left: Vec<_> = std::fs::read_dir(cli.home().join("workspaces"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "no workspace file is left: {left:?}");
}
