//! The memory balloon of a running workspace (part of
//! `life_cycle_exec_files_logs_events`, which boots `dev`, and of its
//! snapshot checks, whose forks restore the balloon from a snapshot).

use std::time::{Duration, Instant};

use testkit::cli::CliHome;

/// Memory filled and freed in the guest: small, as every page of it is
/// the guest kernel's work, which this kind of host emulates (about 2.5 s
/// a MiB). `cargo xtask bench balloon` measures 200 MiB.
const FILL_MIB: u64 = 8;
/// What the statistics must show of the fill.
const FILL_SEEN_MIB: u64 = 6;
/// What must come back: the guest reports free blocks of 4 MiB.
const EXPECTED_MIB: u64 = 4;
/// How long the figures may take (reports go out 2 s after memory is
/// freed; the host emulates the guest's kernel work).
const DEADLINE: Duration = Duration::from_secs(90);

/// The workspace's balloon figures, by `microagent metrics`.
fn balloon(cli: &CliHome, ws: &str) -> serde_json::Value {
    let m = cli.ok_json(&["metrics", ws, "--json"]);
    assert!(m["balloon"].is_object(), "no balloon figures: {m}");
    m["balloon"].clone()
}

fn field(b: &serde_json::Value, key: &str) -> u64 {
    b[key].as_u64().unwrap_or_else(|| panic!("{key}: {b}"))
}

/// Polls the figures of `ws` until `done` holds for them.
fn until(cli: &CliHome, ws: &str, what: &str, done: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let b = balloon(cli, ws);
        if done(&b) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{ws}: {what} within {DEADLINE:?}: {b}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The guest's statistics are fresh (its free memory falls by what it
/// fills), and memory it frees goes back to the host.
pub(crate) fn memory_given_back(cli: &CliHome, ws: &str) {
    let sh = |line: &str| {
        let run = cli.run(&["exec", ws, "--shell", "--", line]);
        assert_eq!(run.status, 0, "{line}: {}", run.stderr);
    };
    let before = balloon(cli, ws);
    let free = field(&before, "guest_free_bytes");
    let given = field(&before, "given_back_bytes");
    sh(&format!(
        "dd if=/dev/zero of=/dev/shm/fill bs=1M count={FILL_MIB} 2>/dev/null"
    ));
    until(cli, ws, "fresh statistics", |b| {
        field(b, "guest_free_bytes") + (FILL_SEEN_MIB << 20) <= free
    });
    sh("rm /dev/shm/fill");
    until(cli, ws, "memory given back", |b| {
        field(b, "given_back_bytes") >= given + (EXPECTED_MIB << 20)
    });
}
