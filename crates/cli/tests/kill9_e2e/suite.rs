//! The kill -9 suite itself (built with the `test-hooks` feature).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::cli::CliHome;
use workspace::pause_point::{PAUSED_PREFIX, PAUSE_VAR, REFUSED_SYSCALL_VAR};

/// How long a process may take to reach its pause point (a start boots).
const REACH: Duration = Duration::from_secs(300);

/// Waits for `child`'s stderr to say it paused at `step`.
fn wait_paused(child: &mut Child, step: &str) {
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = mpsc::channel();
    let want = format!("{PAUSED_PREFIX}{step} ");
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with(&want) {
                let _ = tx.send(Ok(()));
                return;
            }
            seen.push(line);
        }
        let _ = tx.send(Err(seen.join("\n")));
    });
    match rx.recv_timeout(REACH) {
        Ok(Ok(())) => {}
        Ok(Err(stderr)) => panic!("the process ended before pausing at {step}:\n{stderr}"),
        Err(_) => panic!("the process did not reach {step}"),
    }
}

/// Runs `microagent ARGS` until it pauses at `step`, then SIGKILLs it.
fn kill_cli_at(cli: &CliHome, step: &str, args: &[&str]) {
    let mut child = cli
        .command(args)
        .env(PAUSE_VAR, step)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_paused(&mut child, step);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Waits for `name`'s VMM to pause at `step` (it says so in its vmm.log)
/// and SIGKILLs it.
fn kill_vmm_at(cli: &CliHome, name: &str, step: &str) {
    let log = cli.home().join("workspaces").join(name).join("vmm.log");
    let want = format!("{PAUSED_PREFIX}{step} (pid ");
    let deadline = Instant::now() + REACH;
    let pid: i32 = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(at) = text.find(&want) {
            let rest = &text[at + want.len()..];
            break rest[..rest.find(')').unwrap()].parse().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the VMM of {name} never paused at {step}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // SAFETY: kill(2) takes no pointers.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    // Its sockets close before it is dead: the KVM teardown of an exiting
    // process comes after them. Wait for the death the next command sees.
    let deadline = Instant::now() + REACH;
    while workspace_vmm_lives(pid) {
        assert!(Instant::now() < deadline, "VMM {pid} did not die");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `pid` exists and is not a zombie.
fn workspace_vmm_lives(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat.get(i + 2..))
        .and_then(|rest| rest.split_whitespace().next());
    !matches!(state, Some("Z") | Some("X"))
}

fn state(cli: &CliHome, name: &str) -> Value {
    cli.ok_json(&["inspect", name, "--json"])
}

fn names(cli: &CliHome) -> Vec<String> {
    cli.ok_json(&["list", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Hidden entries (half-made or half-removed) under `dir`.
fn hidden(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

fn last_exit_reason(info: &Value) -> String {
    info["last_exit"]["reason"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// The CLI killed at each step of one workspace's life.
fn the_cli(cli: &CliHome) {
    // create: after the disk, before the record. Not listed; the name is free.
    kill_cli_at(cli, "create:disk", &["create", "a"]);
    assert!(!names(cli).contains(&"a".to_owned()));
    assert!(
        !cli.home().join("workspaces/a").exists(),
        "the half-made directory stays"
    );
    assert_eq!(
        cli.run(&["inspect", "a", "--json"]).error_code(),
        "NOT_FOUND"
    );
    cli.ok_json(&["create", "a", "--json"]);

    // start: the VMM was launched; it comes up without the CLI.
    kill_cli_at(cli, "start:waiting", &["start", "a"]);
    let info = state(cli, "a");
    assert!(
        ["starting", "running"].contains(&info["state"].as_str().unwrap()),
        "{info}"
    );
    cli.wait_state("a", "running", REACH);
    assert_eq!(
        cli.ok_json(&["exec", "a", "--json", "--", "true"])["exit_code"],
        0
    );

    // snapshot: the machine was written, the record not: no snapshot, no scratch.
    kill_cli_at(cli, "snapshot:written", &["snapshot", "take", "a", "s1"]);
    let listed = cli.ok_json(&["snapshot", "ls", "--json"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");
    assert!(hidden(&cli.home().join("snapshots")).is_empty());
    assert_eq!(state(cli, "a")["state"], "running");
    cli.ok_json(&["snapshot", "take", "a", "s1", "--json"]);

    // stop: asked; the VMM stops the guest by itself.
    kill_cli_at(cli, "stop:asked", &["stop", "a"]);
    let info = cli.wait_state("a", "stopped", REACH);
    assert_ne!(info["last_exit"]["crashed"], true, "{info}");
    assert_eq!(last_exit_reason(&info), "stopped on request", "{info}");

    // delete: renamed away, not yet removed: gone, and swept by the next listing.
    kill_cli_at(cli, "delete:renamed", &["delete", "a", "--yes"]);
    assert!(!names(cli).contains(&"a".to_owned()));
    assert!(hidden(&cli.home().join("workspaces")).is_empty());
    assert_eq!(
        cli.run(&["inspect", "a", "--json"]).error_code(),
        "NOT_FOUND"
    );
    cli.ok_json(&["snapshot", "rm", "s1", "--json"]);
}

/// A VMM killed before its guest runs, by its seccomp filter, while it
/// writes a snapshot, and after its guest stopped.
fn the_vmm(cli: &CliHome) {
    cli.ok_json(&["create", "b", "--json"]);
    // Cold: a warm start whose VMM dies is retried as a boot (and the
    // image's warm snapshot, which the suites share, discarded).
    let start = cli
        .command(&["start", "b", "--cold", "--json"])
        .env(PAUSE_VAR, "vmm:confined")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    kill_vmm_at(cli, "b", "vmm:confined");
    let started = start.wait_with_output().unwrap();
    assert!(
        !started.status.success(),
        "a start whose VMM was killed succeeded"
    );
    let info = state(cli, "b");
    assert_eq!(info["state"], "crashed", "{info}");
    assert!(
        last_exit_reason(&info).contains("died unexpectedly"),
        "{info}"
    );
    cli.ok_json(&["delete", "b", "--yes", "--json"]);

    // A bug that makes a call outside the filter: the filter ends the
    // VMM, and the next command names the call.
    cli.ok_json(&["create", "f", "--json"]);
    let started = cli
        .command(&["start", "f", "--cold", "--json"])
        .env(REFUSED_SYSCALL_VAR, "vmm:confined")
        .output()
        .unwrap();
    assert!(!started.status.success(), "{started:?}");
    let info = state(cli, "f");
    assert_eq!(info["state"], "crashed", "{info}");
    let reason = last_exit_reason(&info);
    let call = format!(
        "killed by its seccomp filter: the control thread made syscall {} (arguments 0x{:x}, 0x{:x})",
        libc::SYS_socket,
        libc::AF_NETLINK,
        libc::SOCK_RAW
    );
    assert!(reason.contains(&call), "{info}");
    cli.ok_json(&["delete", "f", "--yes", "--json"]);

    cli.ok_json(&["create", "c", "--json"]);
    let started = cli
        .command(&["start", "c", "--json"])
        .env(PAUSE_VAR, "vmm:snapshot")
        .output()
        .unwrap();
    assert!(started.status.success(), "{started:?}");
    let take = cli
        .command(&["snapshot", "take", "c", "s2", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    kill_vmm_at(cli, "c", "vmm:snapshot");
    let took = take.wait_with_output().unwrap();
    assert!(
        !took.status.success(),
        "the snapshot of a killed VMM succeeded"
    );
    let listed = cli.ok_json(&["snapshot", "ls", "--json"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");
    assert!(hidden(&cli.home().join("snapshots")).is_empty());
    assert_eq!(state(cli, "c")["state"], "crashed");
    cli.ok_json(&["delete", "c", "--yes", "--json"]);

    // hibernate: killed after the machine is written, before the record:
    // crashed, nothing named half; killed after the record: hibernated
    // and whole, and the next call restores it.
    // (each a fresh workspace: a warm start, not a boot)
    for (name, step, after) in [
        ("h1", "vmm:hibernation-written", "crashed"),
        ("h2", "vmm:hibernated", "hibernated"),
    ] {
        cli.ok_json(&["create", name, "--json"]);
        let started = cli
            .command(&["start", name, "--json"])
            .env(PAUSE_VAR, step)
            .output()
            .unwrap();
        assert!(started.status.success(), "{started:?}");
        let hibernate = cli
            .command(&["hibernate", name, "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        kill_vmm_at(cli, name, step);
        // Its answer never came: the CLI says so either way.
        let hibernated = hibernate.wait_with_output().unwrap();
        assert!(!hibernated.status.success(), "{hibernated:?}");
        let info = state(cli, name);
        assert_eq!(info["state"], after, "{info}");
        let ws = cli.home().join("workspaces").join(name);
        assert_eq!(ws.join("hibernation").exists(), after == "hibernated");
    }
    let run = cli.run(&["exec", "h2", "--", "echo", "whole"]);
    assert_eq!(
        (run.status, run.stdout.as_str()),
        (0, "whole\n"),
        "{}",
        run.stderr
    );
    for name in ["h1", "h2"] {
        cli.ok_json(&["delete", name, "--yes", "--force", "--json"]);
    }

    cli.ok_json(&["create", "d", "--json"]);
    let started = cli
        .command(&["start", "d", "--json"])
        .env(PAUSE_VAR, "vmm:finishing")
        .output()
        .unwrap();
    assert!(started.status.success(), "{started:?}");
    let stop = cli
        .command(&["stop", "d", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    kill_vmm_at(cli, "d", "vmm:finishing");
    let stopped = stop.wait_with_output().unwrap();
    assert!(stopped.status.success(), "{stopped:?}");
    let info = state(cli, "d");
    assert!(
        ["stopped", "crashed"].contains(&info["state"].as_str().unwrap()),
        "{info}"
    );
    cli.ok_json(&["delete", "d", "--yes", "--json"]);
}

/// The MCP server killed while a start waits and while a create makes the disk.
fn the_mcp_server(cli: &CliHome) {
    let call = testkit::mcp_tools::tool_call;
    let serve = |step: &str, request: Value| {
        let mut server = cli
            .command(&["serve", "mcp"])
            .env(PAUSE_VAR, step)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = server.stdin.take().unwrap();
        for message in testkit::mcp_tools::opening("kill9")
            .iter()
            .chain([&request])
        {
            writeln!(stdin, "{message}").unwrap();
        }
        wait_paused(&mut server, step);
        server.kill().unwrap();
        server.wait().unwrap();
    };
    serve(
        "create:disk",
        call(2, "workspace_create", json!({"name": "e"})),
    );
    assert!(!names(cli).contains(&"e".to_owned()));
    cli.ok_json(&["create", "e", "--json"]);
    serve(
        "start:waiting",
        call(2, "workspace_start", json!({"name": "e"})),
    );
    cli.wait_state("e", "running", REACH);
    cli.ok_json(&["delete", "e", "--yes", "--force", "--json"]);
}

#[test]
fn killed_at_each_step_the_next_command_finds_a_consistent_state() {
    let test = "killed_at_each_step_the_next_command_finds_a_consistent_state";
    let Some(_) = testkit::require(test, testkit::guest_assets()) else {
        return;
    };
    let Some(_) = testkit::require(test, testkit::workspace_image("minimal")) else {
        return;
    };
    let cli = CliHome::new(env!("CARGO_BIN_EXE_microagent"), test);
    let began = Instant::now();
    the_cli(&cli);
    the_vmm(&cli);
    the_mcp_server(&cli);
    eprintln!("done in {:.0} s", began.elapsed().as_secs_f64());
    assert!(names(&cli).is_empty());
    testkit::leftovers::assert_none(cli.home());
}
