//! Hibernation (issue 59): `hibernate` writes a running workspace's machine
//! into its directory and ends its VMM; the next call (from a new CLI
//! process: there is no daemon) restores it in place, with its processes,
//! its /tmp and its published port; `--idle-hibernate` does the same by
//! itself; an MCP server that hibernated it may exit; `stop` discards it.
//! One boot for all of it.

use std::time::{Duration, Instant};

use serde_json::json;
use testkit::cli::CliHome;

use super::mcp_session::McpStdio;
use super::{can_boot, events, free_port, home, host_get, start};

/// Idle this long, it pauses and hibernates by itself.
const IDLE_HIBERNATE: &str = "20s";
/// How long that may take here: the setting, the watcher's quarter, and
/// the guest's kernel work of the idle check, emulated on this host.
const HIBERNATE_WITHIN: Duration = Duration::from_secs(120);

fn hibernations(cli: &CliHome, name: &str) -> usize {
    events(cli, name)
        .iter()
        .filter(|k| k.as_str() == "hibernated")
        .count()
}

/// Checks `name` is hibernated: recorded so, its VMM gone, its machine
/// on disk, and `list`/`inspect` say so.
fn assert_hibernated(cli: &CliHome, name: &str, by: &str) {
    let info = cli.ok_json(&["inspect", name, "--json"]);
    assert_eq!(info["state"], "hibernated", "{info}");
    assert!(info["runtime"].is_null(), "{info}");
    assert_eq!(info["hibernation"]["by"], by, "{info}");
    // It records the hibernation, then ends.
    assert!(
        testkit::wait_until(Duration::from_secs(15), || cli.vmm_pids().is_empty()),
        "a hibernated workspace kept its VMM"
    );
    let dir = cli.home().join("workspaces").join(name).join("hibernation");
    assert!(
        dir.join(vmm_core::snapshot::MEMORY_FILE).exists(),
        "no memory file in {}",
        dir.display()
    );
    let listed = cli.run(&["list"]);
    assert!(listed.stdout.contains("hibernated"), "{}", listed.stdout);
}

/// What the guest says of its note in /tmp and of the process started
/// before (by pid).
fn note_and_sleeper(cli: &CliHome, name: &str, pid: &str) -> String {
    let check = format!("cat /tmp/note && kill -0 {pid} && echo alive");
    let run = cli.run(&["exec", name, "--shell", "--", &check]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    run.stdout
}

/// `workspace_hibernate` through a `serve mcp` that then exits.
fn hibernate_over_mcp(cli: &CliHome, name: &str) {
    let mut mcp = McpStdio::open(cli, "hibernate");
    let result = mcp.call("workspace_hibernate", json!({"name": name}));
    assert_eq!(result["workspace"]["state"], "hibernated", "{result}");
    mcp.close();
}

#[test]
fn a_hibernated_workspace_costs_nothing_and_the_next_call_restores_it() {
    let test = "a_hibernated_workspace_costs_nothing_and_the_next_call_restores_it";
    if !can_boot(test) {
        return;
    }
    let cli = home(test);
    let web = free_port();
    cli.ok(&[
        "create",
        "sleeper",
        "--image",
        "minimal",
        "--idle-pause",
        "0",
        "--idle-hibernate",
        IDLE_HIBERNATE,
        "--publish",
        &format!("{web}:8080"),
    ]);
    assert_eq!(
        cli.run(&[
            "create",
            "bad",
            "--image",
            "minimal",
            "--idle-hibernate",
            "3s"
        ])
        .status,
        2,
        "an idle hibernation under 5 s is refused"
    );
    start(&cli, "sleeper");
    let setup = "echo kept-in-tmp > /tmp/note \
                 && mkdir -p /root/www && echo served-again > /root/www/index.html \
                 && httpd -p 127.0.0.1:8080 -h /root/www \
                 && (sleep 100000 > /dev/null 2>&1 & echo $!)";
    let run = cli.run(&["exec", "sleeper", "--shell", "--", setup]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let pid = run.stdout.trim().to_owned();
    assert!(pid.parse::<u32>().is_ok(), "{pid:?}");

    // A snapshot of it, which may not be restored over its hibernation.
    cli.ok_json(&["snapshot", "take", "sleeper", "before", "--json"]);

    // On request, from one CLI process; restored by the next one's call.
    let began = Instant::now();
    let hibernated = cli.ok_json(&["hibernate", "sleeper", "--json"]);
    eprintln!("hibernated in {:.1} s", began.elapsed().as_secs_f64());
    assert_eq!(hibernated["state"], "hibernated", "{hibernated}");
    assert_hibernated(&cli, "sleeper", "request");
    assert!(
        host_get(web).is_err(),
        "a hibernated workspace's port answered"
    );
    // Its machine is running state: neither a restore over it nor a
    // delete without --force; a TTL set now counts from its wake.
    let refused = cli.run(&["snapshot", "restore", "before", "--json"]);
    assert_eq!(refused.error_code(), "CONFLICT", "{}", refused.stderr);
    let refused = cli.run(&["delete", "sleeper", "--yes", "--json"]);
    assert_ne!(
        refused.status, 0,
        "a hibernated workspace was deleted without --force"
    );
    let ttl = cli.ok_json(&["ttl", "sleeper", "1h", "--json"]);
    assert_eq!(ttl["state"], "hibernated", "{ttl}");
    assert_eq!(ttl["hibernation"]["ttl_left_ms"], 3_600_000, "{ttl}");
    let began = Instant::now();
    assert_eq!(
        note_and_sleeper(&cli, "sleeper", &pid),
        "kept-in-tmp\nalive\n"
    );
    eprintln!(
        "an exec on the hibernated workspace took {:.1} s",
        began.elapsed().as_secs_f64()
    );
    let info = cli.ok_json(&["inspect", "sleeper", "--json"]);
    assert_eq!(info["state"], "running", "{info}");
    assert_eq!(info["runtime"]["start_kind"], "hibernation", "{info}");
    let left = info["runtime"]["ttl_deadline_ms"].as_u64().unwrap_or(0)
        - workspace::host::settings::now_ms();
    assert!((3_500_000..=3_600_000).contains(&left), "{info}");
    cli.ok_json(&["ttl", "sleeper", "off", "--json"]);
    assert!(info["hibernated_ms"].as_u64().unwrap_or(0) > 0, "{info}");
    let page = host_get(web).unwrap();
    assert!(page.ends_with("served-again\n"), "{page}");

    // By itself once idle (its server waits; the sleeper sleeps).
    let began = Instant::now();
    assert!(
        testkit::wait_until(HIBERNATE_WITHIN, || hibernations(&cli, "sleeper") == 2),
        "not hibernated when idle within {HIBERNATE_WITHIN:?}: {:?}",
        events(&cli, "sleeper")
    );
    eprintln!(
        "hibernated when idle after {:.1} s",
        began.elapsed().as_secs_f64()
    );
    cli.wait_state("sleeper", "hibernated", Duration::from_secs(30));
    assert_hibernated(&cli, "sleeper", "idle");
    let resumed = cli.ok_json(&["resume", "sleeper", "--json"]);
    assert_eq!(resumed["state"], "running", "{resumed}");
    assert_eq!(
        note_and_sleeper(&cli, "sleeper", &pid),
        "kept-in-tmp\nalive\n"
    );

    // Hibernated over MCP by a server that then exits.
    hibernate_over_mcp(&cli, "sleeper");
    assert_hibernated(&cli, "sleeper", "request");
    assert_eq!(
        note_and_sleeper(&cli, "sleeper", &pid),
        "kept-in-tmp\nalive\n"
    );

    // A stop of a hibernated workspace discards its machine.
    cli.ok_json(&["hibernate", "sleeper", "--json"]);
    let stopped = cli.ok_json(&["stop", "sleeper", "--json"]);
    assert_eq!(stopped["state"], "stopped", "{stopped}");
    assert!(stopped["hibernation"].is_null(), "{stopped}");
    let ws = cli.home().join("workspaces").join("sleeper");
    for left in ["hibernation", ".hibernation.tmp", ".hibernation.old"] {
        assert!(!ws.join(left).exists(), "{left} left after the stop");
    }
    assert!(cli.vmm_pids().is_empty());
    cli.ok(&["delete", "sleeper", "--yes"]);
}
