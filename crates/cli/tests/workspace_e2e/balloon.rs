//! The memory balloon of a running workspace: part of
//! `life_cycle_exec_files_logs_events`'s snapshot checks, on a fork whose
//! balloon (`dev`'s, made at its boot) was restored from a snapshot.

use std::time::{Duration, Instant};

use testkit::cli::CliHome;

/// Memory filled and freed in the guest beyond its free fragments: small,
/// as every page of it is the guest kernel's work, which this kind of host
/// emulates (about 2.5 s a MiB). `cargo xtask bench balloon` measures
/// 200 MiB. Three whole 4 MiB blocks, so that one comes back whole even
/// when the kernel's own allocations and per-CPU page lists keep pages of
/// two others.
const FILL_BEYOND_FRAGMENTS_MIB: u64 = 12;
/// The most filled in all (the guest has 256 MiB).
const FILL_MAX_MIB: u64 = 64;
/// What the statistics must show of the fill.
const FILL_SEEN_MIB: u64 = 6;
/// What must come back: the guest reports free blocks of 4 MiB (its
/// pageblock order, 10, with no huge pages in the guest kernel).
const EXPECTED_MIB: u64 = 4;
/// Free blocks below that order are fragments.
const REPORTING_ORDER: usize = 10;
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

/// Free guest memory in blocks smaller than the reporting order, from
/// `/proc/buddyinfo` (`Node 0, zone DMA32 <free blocks of order 0> ...`).
/// An allocation takes these first, so a fill smaller than them splits no
/// whole block and frees none: the flake this sizing ends (a fork restored
/// from a snapshot gave nothing back for 90 s after an 8 MiB fill).
fn fragment_bytes(buddyinfo: &str) -> u64 {
    buddyinfo
        .lines()
        .flat_map(|line| {
            let counts = line.split_once("zone").map_or("", |(_, rest)| rest);
            counts
                .split_whitespace()
                .skip(1)
                .take(REPORTING_ORDER)
                .enumerate()
                .map(|(order, count)| count.parse::<u64>().unwrap_or(0) * (4096 << order))
                .collect::<Vec<_>>()
        })
        .sum()
}

#[test]
fn fragments_are_the_blocks_below_the_reporting_order() {
    let info = "Node 0, zone      DMA      1      0      0      0      0      0      0      0      0      1      3 \n\
                Node 0, zone    DMA32      3      2      1      0      0      0      0      0      0      0     57 \n";
    // DMA: one 4 KiB page and one 2 MiB block; DMA32: 3 + 2*2 + 1*4 pages.
    assert_eq!(fragment_bytes(info), 4096 + (2 << 20) + (3 + 4 + 4) * 4096);
}

/// The guest's statistics are fresh (its free memory falls by what it
/// fills), and memory it frees goes back to the host.
pub(crate) fn memory_given_back(cli: &CliHome, ws: &str) {
    let sh = |line: &str| {
        let run = cli.run(&["exec", ws, "--shell", "--", line]);
        assert_eq!(run.status, 0, "{line}: {}", run.stderr);
    };
    let buddyinfo = cli.run(&["exec", ws, "--", "cat", "/proc/buddyinfo"]);
    assert_eq!(buddyinfo.status, 0, "buddyinfo: {}", buddyinfo.stderr);
    let fragments_mib = fragment_bytes(&buddyinfo.stdout).div_ceil(1 << 20);
    let fill_mib = (fragments_mib + FILL_BEYOND_FRAGMENTS_MIB).min(FILL_MAX_MIB);
    let before = balloon(cli, ws);
    let free = field(&before, "guest_free_bytes");
    let given = field(&before, "given_back_bytes");
    sh(&format!(
        "dd if=/dev/zero of=/dev/shm/fill bs=1M count={fill_mib} 2>/dev/null"
    ));
    until(cli, ws, "fresh statistics", |b| {
        field(b, "guest_free_bytes") + (FILL_SEEN_MIB << 20) <= free
    });
    sh("rm /dev/shm/fill");
    let what =
        format!("memory given back after {fill_mib} MiB filled ({fragments_mib} MiB in fragments)");
    until(cli, ws, &what, |b| {
        field(b, "given_back_bytes") >= given + (EXPECTED_MIB << 20)
    });
}
