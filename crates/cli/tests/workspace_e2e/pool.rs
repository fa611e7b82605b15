//! Pools of ready workspaces: a claimed member is a workspace of its own
//! (name, randomness, clock, disk), the pool refills, a killed member
//! leaves nothing and is replaced, and drains are recorded.

use std::time::{Duration, Instant};

use testkit::cli::CliHome;

use super::{can_boot, home};

/// The minimal image's pool as `pool ls --json` shows it.
fn minimal_pool(cli: &CliHome) -> serde_json::Value {
    let all = cli.ok_json(&["pool", "ls", "--json"]);
    all.as_array()
        .and_then(|a| a.iter().find(|p| p["image"] == "minimal").cloned())
        .unwrap_or(serde_json::Value::Null)
}

fn wait_ready(cli: &CliHome, ready: u64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let pool = minimal_pool(cli);
        if pool["ready"] == ready && pool["starting"] == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the pool never had {ready} ready: {pool}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The pool members' directories, by name.
fn members(cli: &CliHome) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(cli.home().join("workspaces"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".microagent-pool"))
        .collect();
    names.sort();
    names
}

/// The members ready to be claimed (from their records: a listing would
/// start a filler).
fn ready_members(cli: &CliHome) -> Vec<String> {
    members(cli)
        .into_iter()
        .filter(|m| {
            let path = cli.home().join("workspaces").join(m).join("meta.json");
            std::fs::read(path)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .is_some_and(|meta| meta["pool"]["ready"] == true)
        })
        .collect()
}

fn member_meta(cli: &CliHome, member: &str) -> serde_json::Value {
    let path = cli.home().join("workspaces").join(member).join("meta.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn drains(cli: &CliHome) -> Vec<String> {
    cli.ok_json(&["pool", "events", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// One guest's view of itself: hostname, 16 random bytes, its clock.
fn identity(cli: &CliHome, name: &str) -> (String, String, u64) {
    let run = cli.ok(&[
        "exec",
        name,
        "--",
        "sh",
        "-c",
        "hostname; head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s",
    ]);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", run.stdout);
    (
        lines[0].to_owned(),
        lines[1].to_owned(),
        lines[2].parse().unwrap(),
    )
}

fn host_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
fn a_pool_gives_ready_workspaces_that_are_their_own() {
    let test = "a_pool_gives_ready_workspaces_that_are_their_own";
    if !can_boot(test) {
        return;
    }
    let cli = home(test);
    let set = cli.ok_json(&["pool", "set", "minimal", "2", "--json"]);
    assert_eq!(set["size"], 2, "{set}");
    wait_ready(&cli, 2, Duration::from_secs(600));
    assert!(
        cli.ok_json(&["list", "--json", "-n", "*"])
            .as_array()
            .unwrap()
            .is_empty(),
        "pool members are listed"
    );

    // Two claims: each a workspace of its own.
    let mut seen = Vec::new();
    for name in ["pa", "pb"] {
        cli.ok(&["create", name, "--image", "minimal"]);
        let began = Instant::now();
        let started = cli.ok_json(&["start", name, "--json"]);
        eprintln!(
            "{name} started from the pool in {:.2} s",
            began.elapsed().as_secs_f64()
        );
        assert_eq!(started["state"], "running", "{started}");
        let info = cli.ok_json(&["inspect", name, "--json"]);
        assert_eq!(info["runtime"]["start_kind"], "pooled", "{info}");
        // The guest's clock is read while the command runs: between the
        // host's clock before and after it (a second either side for the
        // rounding), however slow the command is.
        let before = host_secs();
        let (hostname, random, clock) = identity(&cli, name);
        let after = host_secs();
        assert_eq!(hostname, name);
        assert!(
            (before.saturating_sub(1)..=after + 1).contains(&clock),
            "{name}'s clock is {clock}, the host's was {before} to {after}"
        );
        seen.push(random);
    }
    assert_ne!(
        seen[0], seen[1],
        "two claimed guests gave the same random bytes"
    );
    cli.ok(&[
        "exec",
        "pa",
        "--",
        "sh",
        "-c",
        "echo mine > /root/own && sync",
    ]);
    let own = cli.ok(&["exec", "pa", "--", "cat", "/root/own"]);
    assert_eq!(own.stdout.trim(), "mine");
    let other = cli.run(&["exec", "pb", "--", "test", "-e", "/root/own"]);
    assert_eq!(
        other.status, 1,
        "pa's file is on pb's disk: {}",
        other.stderr
    );

    // Refilled after the claims.
    wait_ready(&cli, 2, Duration::from_secs(600));

    // A member killed with SIGKILL leaves nothing and is replaced.
    let victim = members(&cli).remove(0);
    let meta = member_meta(&cli, &victim);
    let pid = meta["runtime"]["pid"].as_u64().unwrap() as i32;
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    // SAFETY: kill takes two integers.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z")) {
        assert!(Instant::now() < deadline, "the killed member's VMM runs on");
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_ready(&cli, 2, Duration::from_secs(600));
    assert!(!members(&cli).contains(&victim), "{victim} stays");
    assert!(!cli
        .home()
        .join(format!("workspaces/{victim}.lock"))
        .exists());
    for child in children.split_whitespace() {
        assert!(
            !std::path::Path::new(&format!("/proc/{child}")).exists()
                || std::fs::read_to_string(format!("/proc/{child}/stat"))
                    .is_ok_and(|s| s.contains(") Z")),
            "the killed member's helper {child} (passt) still runs"
        );
    }
    let group = workspace::host::cgroup::group_id(cli.home(), &victim);
    assert!(
        !testkit::leftovers::cgroups_of(cli.home())
            .iter()
            .any(|g| g.ends_with(&group)),
        "the killed member's cgroup stays"
    );

    // A member of another kernel or image build (its recorded warm
    // fingerprint differs from what the image has now) is drained, with
    // an event, and replaced.
    let stale = members(&cli).remove(0);
    let path = cli.home().join("workspaces").join(&stale).join("meta.json");
    let mut meta = member_meta(&cli, &stale);
    meta["pool"]["fingerprint"] = "an older kernel".into();
    std::fs::write(&path, serde_json::to_vec(&meta).unwrap()).unwrap();
    wait_ready(&cli, 2, Duration::from_secs(600));
    assert!(!members(&cli).contains(&stale));
    assert!(
        drains(&cli).iter().any(|r| r.contains("kernel")),
        "{:?}",
        drains(&cli)
    );

    // A start the host budget refuses takes a member's place: members are
    // the first thing given back. (Its own egress policy makes it no
    // member's: it warm-starts.)
    std::fs::write(cli.home().join("budget.json"), r#"{"max_running": 4}"#).unwrap();
    cli.ok(&["create", "pc", "--image", "minimal", "--egress", "none"]);
    let started = cli.ok_json(&["start", "pc", "--json"]);
    assert_eq!(started["runtime"]["start_kind"], "warm", "{started}");
    assert!(
        drains(&cli).iter().any(|r| r.contains("host budget")),
        "{:?}",
        drains(&cli)
    );
    // (A refill may be making one beside it, which the budget refuses.)
    assert_eq!(ready_members(&cli).len(), 1, "{:?}", members(&cli));
    cli.ok(&["delete", "pc", "--force", "--yes"]);
    std::fs::remove_file(cli.home().join("budget.json")).unwrap();

    // Deleting the image drains its pool with an event.
    for name in ["pa", "pb"] {
        cli.ok(&["delete", name, "--force", "--yes"]);
    }
    let before = ready_members(&cli);
    assert!(!before.is_empty());
    cli.ok(&["image", "rm", "minimal"]);
    let after = members(&cli);
    assert!(
        before.iter().all(|m| !after.contains(m)),
        "{before:?} -> {after:?}"
    );
    assert!(
        drains(&cli).iter().any(|r| r.contains("image was deleted")),
        "{:?}",
        drains(&cli)
    );
    cli.ok(&["pool", "set", "minimal", "0"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !(members(&cli).is_empty() && cli.vmm_pids().is_empty()) {
        assert!(
            Instant::now() < deadline,
            "pool members stay: {:?}",
            members(&cli)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
