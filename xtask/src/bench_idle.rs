//! `cargo xtask bench idle [--forks N] [--release]`: what idle workspaces
//! cost the host's CPUs before and after their idle pause, and what the
//! first call on a paused one costs. Forks of one snapshot of a running
//! `minimal` workspace created with `--idle-pause 90s` (the forks inherit
//! it), N of them (default 10: an idle guest whose kernel is emulated costs about a tenth of a core) at once: the CPU time of all their
//! processes (VMMs and passt) over a window while the first
//! `FORK_BATCH` of them idle running, then, the rest made a batch at a
//! time (each left to pause first), over the same window once all N are
//! paused; then `exec true` on
//! paused forks (the call that wakes each) beside a second `exec true` on
//! the same fork, running, median of several; then `hibernate` of those
//! forks, what is left of them on the host, and `exec true` on each
//! hibernated one (it is restored first) beside the same call on it
//! running, and, hibernated again, `resume` of each (the wake alone)
//! beside a warm start (`start` of a fresh `minimal` workspace from the
//! image's warm snapshot, no pool): both restore a machine and wait for
//! its agent; and, hibernated once more, `fs stat` (a call the agent
//! answers without starting a guest process) beside the same call running.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::bench_forks::{
    clean_up, fork, fork_paced, prepare, processes_of, snapshot_source, wait_paused, ForkArgs,
    FORK_BATCH,
};
use crate::bench_workspace::microagent;

/// The forks' idle pause: long enough that the running window (after a
/// batch's forks and their first calls, ~40 s here) ends before the
/// first fork's idle check and pause, which are guest work of their own
/// (with 45 s, 25 forks' checks fell inside the window: 172.9 % of a core
/// where it is ~10 %).
const IDLE_PAUSE: &str = "90s";
/// How long each CPU window lasts.
const WINDOW: Duration = Duration::from_secs(15);
/// How many forks the first-call comparison takes.
const CALLS: usize = 7;

/// CPU ticks (1/100 s) used so far by every process serving `home` (with
/// children they reaped: none do during a window).
fn ticks_of(home: &Path) -> u64 {
    processes_of(home)
        .into_iter()
        .filter_map(|(pid, _)| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            workspace::store::process::cpu_ticks(&stat)
        })
        .sum()
}

/// Percent of one core the processes of `home` use over `WINDOW`.
fn cpu_percent(home: &Path) -> f64 {
    let (before, began) = (ticks_of(home), Instant::now());
    std::thread::sleep(WINDOW);
    let used = ticks_of(home).saturating_sub(before) as f64 / 100.0;
    100.0 * used / began.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let args = ForkArgs::parse(args, "idle", 10, CALLS)?;
    let (bin, home) = prepare(args.release, "bidle")?;
    let result = measure(&bin, &home, args.forks);
    clean_up(&bin, &home, args.forks);
    result
}

fn measure(bin: &Path, home: &Path, forks: usize) -> anyhow::Result<()> {
    snapshot_source(bin, home, &["--idle-pause", IDLE_PAUSE])?;
    // The running reference: the first batch, running idle at once (more
    // than a batch would fill this host's CPUs; see FORK_BATCH).
    let first = forks.min(FORK_BATCH);
    let began = Instant::now();
    for i in 0..first {
        fork(bin, home, i).with_context(|| format!("fork {} of {forks}", i + 1))?;
    }
    eprintln!(
        "xtask: {first} forks running ({:.0} s); every agent answering",
        began.elapsed().as_secs_f64()
    );
    let calls_began = Instant::now();
    for i in 0..first {
        microagent(
            bin,
            home,
            &["exec", &format!("f{i}"), "--json", "--", "true"],
        )
        .with_context(|| format!("fork f{i}'s agent"))?;
    }
    let running = cpu_percent(home);
    // Past the idle pause, the first forks' idle checks were in the window.
    eprintln!(
        "xtask: the running window ended {:.0} s after the first fork's call (idle pause {IDLE_PAUSE})",
        calls_began.elapsed().as_secs_f64()
    );
    let waiting = Instant::now();
    wait_paused(bin, home, 0, first, Duration::from_secs(600))?;
    eprintln!(
        "xtask: every fork paused {:.0} s after the running window",
        waiting.elapsed().as_secs_f64()
    );
    fork_paced(bin, home, first, forks)?;
    let paused = cpu_percent(home);
    let paused_longest = waiting.elapsed();
    let (woken, again) = wake_and_call(bin, home, 0..CALLS)?;
    // The last batch had paused only minutes before: beside the first
    // forks, whether how long a guest was paused changes its first call.
    let recent = (forks >= first + CALLS)
        .then(|| wake_and_call(bin, home, forks - CALLS..forks))
        .transpose()?;
    let hibernated = hibernate_and_call(bin, home)?;
    println!("idle: {forks} forks of one 256 MiB minimal snapshot, --idle-pause {IDLE_PAUSE}:");
    println!(
        "  host CPU of all their processes, running idle   {running:>7.1} % of a core ({WINDOW:?}, the first {first} forks)"
    );
    println!(
        "  host CPU of all their processes, idle-paused    {paused:>7.1} % of a core ({WINDOW:?}, all {forks})"
    );
    println!("  exec true on an idle-paused fork (it resumes)   {woken:>7.0} ms median of {CALLS}");
    println!(
        "  exec true on the same fork, running (reference) {again:>7.0} ms median of {CALLS} ({:.2}x; the first forks, paused up to {:.0} min)",
        woken / again,
        paused_longest.as_secs_f64() / 60.0
    );
    if let Some((woken, again)) = recent {
        println!(
            "  the same on the last forks made (paused minutes) {woken:>6.0} ms against {again:.0} ms running ({:.2}x)",
            woken / again
        );
    }
    let h = hibernated;
    println!(
        "  hibernate an idle-paused fork                   {:>7.0} ms median of {CALLS} ({:.1} MiB of memory written each)",
        h.hibernate_ms,
        h.memory_mib
    );
    println!(
        "  processes left of {CALLS} hibernated forks          {:>7}",
        h.processes_left
    );
    println!(
        "  exec true on a hibernated fork (it is restored) {:>7.0} ms median of {CALLS}",
        h.call_ms
    );
    println!(
        "  the same call on it running (reference)         {:>7.0} ms median of {CALLS} ({:.2}x)",
        h.running_ms,
        h.call_ms / h.running_ms
    );
    println!(
        "  resume of a hibernated fork (the wake alone)    {:>7.0} ms median of {CALLS}",
        h.resume_ms
    );
    println!(
        "  fs stat on a hibernated fork (no guest process) {:>7.0} ms median of {CALLS}",
        h.stat_ms
    );
    println!(
        "  the same fs stat on it running (reference)      {:>7.0} ms median of {CALLS}",
        h.stat_running_ms
    );
    println!(
        "  warm start of a fresh workspace (reference)     {:>7.0} ms median of {CALLS} (wake {:.2}x; exec call {:.2}x; fs stat call {:.2}x)",
        h.warm_ms,
        h.resume_ms / h.warm_ms,
        h.call_ms / h.warm_ms,
        h.stat_ms / h.warm_ms
    );
    Ok(())
}

/// `exec true` on each fork of `forks` while idle-paused (the call that
/// wakes it), then again on it running; the medians, ms. Each fork's
/// times and what its guest printed on its console meanwhile (a kernel
/// report there is emulated work the first call waits for) go to stderr.
fn wake_and_call(
    bin: &Path,
    home: &Path,
    forks: std::ops::Range<usize>,
) -> anyhow::Result<(f64, f64)> {
    let (mut woken, mut again) = (Vec::new(), Vec::new());
    for i in forks {
        let name = format!("f{i}");
        let console = home.join("workspaces").join(&name).join("console.log");
        let printed_before = std::fs::metadata(&console).map_or(0, |m| m.len());
        // The page faults of its VMM over each call: whether the first
        // waits for guest memory the host took back while it was paused
        // (the page cache of the snapshot's file).
        let vmm = microagent(bin, home, &["inspect", &name, "--json"])?["runtime"]["pid"].as_u64();
        let mut faults = Vec::new();
        for times in [&mut woken, &mut again] {
            let before = vmm.and_then(faults_of);
            let t = Instant::now();
            microagent(bin, home, &["exec", &name, "--json", "--", "true"])?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            let after = vmm.and_then(faults_of);
            faults.push(match (before, after) {
                (Some(b), Some(a)) => format!(
                    "{} minor, {} major",
                    a.0.saturating_sub(b.0),
                    a.1.saturating_sub(b.1)
                ),
                _ => "?".to_owned(),
            });
        }
        let text = std::fs::read(&console).unwrap_or_default();
        let new = String::from_utf8_lossy(text.get(printed_before as usize..).unwrap_or(&[]));
        eprintln!(
            "xtask: {name}: woken {:.0} ms ({} page faults), again {:.0} ms ({}); its console meanwhile: {} lines{}",
            woken.last().copied().unwrap_or(f64::NAN),
            faults[0],
            again.last().copied().unwrap_or(f64::NAN),
            faults[1],
            new.lines().count(),
            new.lines()
                .next()
                .map_or(String::new(), |first| format!(", the first: {:?}", first))
        );
    }
    Ok((median(woken), median(again)))
}

/// The minor and major page faults of process `pid` so far (fields 10
/// and 12 of `/proc/<pid>/stat`).
fn faults_of(pid: u64) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields = workspace::store::process::stat_fields(&stat)?;
    Some((fields.get(7)?.parse().ok()?, fields.get(9)?.parse().ok()?))
}

/// What hibernating the first forks cost and left.
struct Hibernated {
    hibernate_ms: f64,
    memory_mib: f64,
    processes_left: usize,
    call_ms: f64,
    running_ms: f64,
    resume_ms: f64,
    stat_ms: f64,
    stat_running_ms: f64,
    warm_ms: f64,
}

/// Hibernates `f0` .. `f{CALLS - 1}`, counts what is left of them, calls
/// each (restoring it) and again (running), hibernates them again and
/// resumes each, and times as many warm starts.
fn hibernate_and_call(bin: &Path, home: &Path) -> anyhow::Result<Hibernated> {
    let (mut hibernate, mut memory) = (Vec::new(), Vec::new());
    let before = processes_of(home).len();
    for i in 0..CALLS {
        let name = format!("f{i}");
        let t = Instant::now();
        let meta = microagent(bin, home, &["hibernate", &name, "--json"])?;
        hibernate.push(t.elapsed().as_secs_f64() * 1000.0);
        if meta["state"] != "hibernated" {
            bail!("{name} did not hibernate: {meta}");
        }
        let file = home
            .join("workspaces")
            .join(&name)
            .join("hibernation")
            .join(vmm_core::snapshot::MEMORY_FILE);
        memory.push(allocated_mib(&file));
    }
    // Each fork had a VMM and a passt.
    let processes_left = (processes_of(home).len() + 2 * CALLS).saturating_sub(before);
    let mut calls = Vec::new();
    for i in 0..CALLS {
        let t = Instant::now();
        microagent(
            bin,
            home,
            &["exec", &format!("f{i}"), "--json", "--", "true"],
        )?;
        calls.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (mut running, mut resumes) = (Vec::new(), Vec::new());
    for i in 0..CALLS {
        let name = format!("f{i}");
        let t = Instant::now();
        microagent(bin, home, &["exec", &name, "--json", "--", "true"])?;
        running.push(t.elapsed().as_secs_f64() * 1000.0);
        microagent(bin, home, &["hibernate", &name, "--json"])?;
        let t = Instant::now();
        let meta = microagent(bin, home, &["resume", &name, "--json"])?;
        resumes.push(t.elapsed().as_secs_f64() * 1000.0);
        if meta["state"] != "running" {
            bail!("{name} did not resume: {meta}");
        }
    }
    // A call that starts no guest process (`fs stat`, the agent answers
    // itself): the wake beside the call alone, where `exec` adds a guest
    // process, about a second of emulated kernel work on this host.
    let (mut stats, mut stats_running) = (Vec::new(), Vec::new());
    for i in 0..CALLS {
        let name = format!("f{i}");
        microagent(bin, home, &["hibernate", &name, "--json"])?;
        for times in [&mut stats, &mut stats_running] {
            let t = Instant::now();
            let meta = microagent(bin, home, &["fs", "stat", &name, "/etc/hostname", "--json"])?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            if meta["exists"] != true {
                bail!("{name}: fs stat did not find /etc/hostname: {meta}");
            }
        }
    }
    let mut warm = Vec::new();
    for i in 0..CALLS {
        let name = format!("w{i}");
        microagent(
            bin,
            home,
            &["create", &name, "--image", "minimal", "--json"],
        )?;
        let t = Instant::now();
        let meta = microagent(bin, home, &["start", &name, "--json"])?;
        warm.push(t.elapsed().as_secs_f64() * 1000.0);
        if meta["runtime"]["start_kind"] != "warm" {
            bail!("{name} did not start warm: {meta}");
        }
        let _ = microagent(bin, home, &["halt", &name]);
    }
    Ok(Hibernated {
        hibernate_ms: median(hibernate),
        memory_mib: median(memory),
        processes_left,
        call_ms: median(calls),
        running_ms: median(running),
        resume_ms: median(resumes),
        stat_ms: median(stats),
        stat_running_ms: median(stats_running),
        warm_ms: median(warm),
    })
}

/// MiB of disk a sparse file takes.
fn allocated_mib(file: &Path) -> f64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(file).map_or(0.0, |m| (m.blocks() * 512) as f64 / f64::from(1u32 << 20))
}
