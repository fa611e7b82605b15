//! Pause on idle (issue 59): a workspace with nothing to do stops its
//! vCPUs after its `--idle-pause`, and whatever reaches it next (a
//! command, a published port's connection, a terminal) resumes it first;
//! a background process or an open connection beyond the guest keeps it
//! running. One boot for all of it.

use std::time::{Duration, Instant};

use testkit::cli::CliHome;
use testkit::terminal::Terminal;

use super::{can_boot, events, free_port, home, host_get, start};

/// The shortest idle pause there is: the check asks every quarter of it.
const IDLE_PAUSE: &str = "5s";
/// How long a pause may take to come: the pause, a few checks, and the
/// guest's kernel work of each, emulated on this kind of host.
const PAUSE_WITHIN: Duration = Duration::from_secs(40);

/// How long the test keeps the guest paused before the call that checks
/// its clocks.
const STILL_FOR: Duration = Duration::from_secs(6);

/// Seconds since boot from `/proc/uptime`'s first field.
fn guest_uptime(proc_uptime: &str) -> f64 {
    let first = proc_uptime.split_whitespace().next().unwrap_or_default();
    first
        .parse()
        .unwrap_or_else(|_| panic!("not an uptime: {proc_uptime:?}"))
}

/// How many `paused` and `resumed` events the workspace has.
fn pauses_and_resumes(cli: &CliHome, name: &str) -> (usize, usize) {
    let kinds = events(cli, name);
    let count = |k: &str| kinds.iter().filter(|e| e.as_str() == k).count();
    (count("paused"), count("resumed"))
}

/// Waits until `name` is recorded as paused because it was idle, and
/// checks `list` and `inspect` say so.
fn wait_paused(cli: &CliHome, name: &str, pauses_before: usize) {
    let began = Instant::now();
    assert!(
        testkit::wait_until(PAUSE_WITHIN, || {
            pauses_and_resumes(cli, name).0 > pauses_before
        }),
        "{name} was not paused within {PAUSE_WITHIN:?}: {:?}",
        events(cli, name)
    );
    eprintln!("{name} paused after {:.1} s", began.elapsed().as_secs_f64());
    let inspected = cli.ok_json(&["inspect", name, "--json"]);
    assert_eq!(inspected["state"], "running", "{inspected}");
    assert_eq!(inspected["runtime"]["paused"], "idle", "{inspected}");
    let listed = cli.run(&["list"]);
    assert!(
        listed.stdout.contains("running (paused: idle)"),
        "{}",
        listed.stdout
    );
}

/// The latest `resumed` event's `by`.
fn last_resumed_by(cli: &CliHome, name: &str) -> String {
    let run = cli.run(&["events", name, "--json"]);
    run.stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .rfind(|e| e["kind"] == "resumed")
        .map(|e| e["by"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

#[test]
fn an_idle_workspace_pauses_and_each_call_resumes_it() {
    let test = "an_idle_workspace_pauses_and_each_call_resumes_it";
    if !can_boot(test) {
        return;
    }
    let cli = home(test);
    let web = free_port();
    // A host service the guest keeps a connection to.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_port = held.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for conn in held.incoming().flatten() {
            open.push(conn);
        }
    });
    cli.ok(&[
        "create",
        "idler",
        "--image",
        "minimal",
        "--idle-pause",
        IDLE_PAUSE,
        "--publish",
        &format!("{web}:8080"),
        "--allow",
        &format!("host:{held_port}"),
    ]);
    assert_eq!(
        cli.run(&["create", "bad", "--image", "minimal", "--idle-pause", "2s"])
            .status,
        2,
        "an idle pause under 5 s is refused"
    );
    start(&cli, "idler");
    // A server waiting for connections is not work: it lets the guest
    // pause, and its port's next connection wakes it.
    let serve = "mkdir -p /root/www && echo from-the-guest > /root/www/index.html \
                 && httpd -p 127.0.0.1:8080 -h /root/www";
    assert_eq!(
        cli.run(&["exec", "idler", "--shell", "--", serve]).status,
        0
    );

    wait_paused(&cli, "idler", 0);
    let page = host_get(web).unwrap();
    assert!(page.ends_with("from-the-guest\n"), "{page}");
    assert_eq!(last_resumed_by(&cli, "idler"), "a call");
    let inspected = cli.ok_json(&["inspect", "idler", "--json"]);
    assert!(inspected["runtime"]["paused"].is_null(), "{inspected}");

    // The guest's clock stands still while it is paused (so its kernel
    // has no seconds to catch up at the wake), and the waking call's hello
    // sets its wall clock to the host's before the command runs.
    let began = Instant::now();
    let uptime_before = guest_uptime(
        &cli.ok(&["exec", "idler", "--", "cat", "/proc/uptime"])
            .stdout,
    );
    wait_paused(&cli, "idler", 1);
    std::thread::sleep(STILL_FOR);
    let awake = "echo awake; date +%s; cat /proc/uptime";
    let host_secs = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let host_before = host_secs();
    let echoed = cli.run(&["exec", "idler", "--shell", "--", awake]);
    let host_after = host_secs();
    let window = began.elapsed();
    assert_eq!(echoed.status, 0, "{}", echoed.stderr);
    let lines: Vec<&str> = echoed.stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"awake"), "{}", echoed.stdout);
    let guest_now: u64 = lines[1].parse().unwrap();
    // Within the call, whatever the call took on a loaded host (a guest
    // clock that stood still would be STILL_FOR behind the call's start).
    assert!(
        (host_before.saturating_sub(1)..=host_after + 1).contains(&guest_now),
        "the woken guest's clock says {guest_now}, the host's was {host_before}..{host_after} during the call"
    );
    let ran = guest_uptime(lines[2]) - uptime_before;
    assert!(
        ran + STILL_FOR.as_secs_f64() <= window.as_secs_f64() + 0.1,
        "the guest counted {ran:.2} s of {:.2} s with a pause of over {STILL_FOR:?}",
        window.as_secs_f64()
    );
    assert_eq!(pauses_and_resumes(&cli, "idler").1, 2);

    wait_paused(&cli, "idler", 2);
    let mut term = Terminal::spawn(cli.command(&["shell", "idler"]), 24, 80);
    term.type_text("echo term-$((6*7))\n");
    term.wait_for("term-42", Duration::from_secs(60));
    // An open terminal is use: no pause while it lasts.
    let (pauses, _) = pauses_and_resumes(&cli, "idler");
    std::thread::sleep(Duration::from_secs(15));
    assert_eq!(
        pauses_and_resumes(&cli, "idler").0,
        pauses,
        "paused under a terminal"
    );
    term.type_text("exit\n");
    assert_eq!(term.wait_exit(Duration::from_secs(60)).code(), Some(0));

    // A background process is work: no pause until it ends.
    let started = cli.ok_json(&["exec", "idler", "--detach", "--json", "--", "sleep", "25"]);
    let id = started["id"].as_str().unwrap().to_owned();
    let (pauses, _) = pauses_and_resumes(&cli, "idler");
    std::thread::sleep(Duration::from_secs(15));
    assert_eq!(
        pauses_and_resumes(&cli, "idler").0,
        pauses,
        "paused under a background process"
    );
    let waited = cli.run(&["process", "wait", "idler", &id, "--timeout", "60"]);
    assert_eq!(waited.status, 0, "{}", waited.stderr);
    wait_paused(&cli, "idler", pauses);

    // An open connection beyond the guest is work too (a download, a
    // clone), though it uses no CPU and the agent did not start it.
    let (pauses, _) = pauses_and_resumes(&cli, "idler");
    let hold = format!("sleep 1000 | nc host.microagent.internal {held_port} >/dev/null 2>&1 &");
    assert_eq!(
        cli.run(&["exec", "idler", "--shell", "--", &hold]).status,
        0
    );
    std::thread::sleep(Duration::from_secs(20));
    assert_eq!(
        pauses_and_resumes(&cli, "idler").0,
        pauses,
        "paused under an open connection"
    );
    // The minimal image's busybox has no killall; `read` is the shell's
    // own (a `cat` per process was some sixty guest processes, seconds
    // each on an emulating host).
    let end = "for p in /proc/[0-9]*; do c=; read c < $p/comm 2>/dev/null; \
               case \"$c\" in nc|sleep) kill ${p#/proc/};; esac; done";
    assert_eq!(cli.run(&["exec", "idler", "--shell", "--", end]).status, 0);
    wait_paused(&cli, "idler", pauses);
    // Stopping a paused workspace is a call like any other.
    cli.ok(&["stop", "idler"]);
    super::assert_no_leftovers(&cli, "idler");
}
