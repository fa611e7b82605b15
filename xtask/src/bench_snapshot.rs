//! `cargo xtask bench snapshot [--runs N]`: snapshot figures through the
//! release binaries (`cargo xtask dist`), each beside the cold boot measured
//! in the same run: snapshot take time (guest pause, as the VMM measures it,
//! and the whole command) and size on disk of a 256 MiB guest; restore from
//! VMM process launch to vCPU running and to agent answering (forks of the
//! snapshot, each alone on the host); create+start of a fresh workspace from the image's warm
//! snapshot; the host memory (PSS) of 5 forks of one snapshot beside that
//! of the workspace they came from.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::Value;

use crate::bench_workspace::microagent;
use crate::{dist, images, kernel};

/// Targets on our emulating host (issue 12).
const TARGET_TAKE_MS: f64 = 100.0;
const TARGET_RESTORE_MS: f64 = 10.0;
const TARGET_FORKS_PSS_RATIO: f64 = 2.0;
const FORKS: usize = 5;

fn spread(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "median {:>9.1}  min {:>9.1}  max {:>9.1}",
        v[v.len() / 2],
        v[0],
        v[v.len() - 1]
    )
}

/// Proportional set size of process `pid` in KiB (shared pages divided
/// among the processes that map them).
fn pss_kib(pid: u64) -> anyhow::Result<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .with_context(|| format!("reading smaps_rollup of {pid}"))?;
    rollup
        .lines()
        .find(|l| l.starts_with("Pss:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .context("no Pss line")
}

fn vmm_pid(info: &Value) -> anyhow::Result<u64> {
    info["runtime"]["pid"].as_u64().context("no VMM pid")
}

fn ms(us: &Value) -> Option<f64> {
    us.as_u64().map(|us| us as f64 / 1000.0)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "meets"
    } else {
        "misses"
    }
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let (args, against) = crate::bench::split_against(args)?;
    let runs: usize = match args.as_slice() {
        [] => 5,
        [flag, n] if flag == "--runs" => n.parse().context("--runs takes a number")?,
        _ => bail!("usage: cargo xtask bench snapshot [--runs N] [--against DIST_DIR]"),
    };
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let bin = dist::build()?;
    measure_in_fresh_home(&bin, runs)?;
    if let Some(other) = against {
        println!("against, same run: {}", other.dist.display());
        other.use_its_assets();
        measure_in_fresh_home(&other.microagent(), runs)?;
    }
    Ok(())
}

/// [`measure`] in a state directory of its own, removed afterwards.
fn measure_in_fresh_home(bin: &Path, runs: usize) -> anyhow::Result<()> {
    let home = std::path::PathBuf::from(format!(
        "/tmp/ma-bench-snap-{}-{}",
        std::process::id(),
        workspace::host::settings::unique_id()
    ));
    let _ = std::fs::remove_dir_all(&home);
    let result = measure(bin, &home, runs);
    let _ = microagent(bin, &home, &["delete", "src", "--yes", "--force"]);
    let names = (0..FORKS).map(|i| format!("f{i}"));
    for name in names.chain((0..runs).map(|i| format!("r{i}"))) {
        let _ = microagent(bin, &home, &["delete", &name, "--yes", "--force"]);
    }
    let _ = std::fs::remove_dir_all(&home);
    result
}

fn measure(bin: &Path, home: &Path, runs: usize) -> anyhow::Result<()> {
    eprintln!("xtask: cold boot of a 256 MiB workspace");
    let began = Instant::now();
    microagent(bin, home, &["create", "src", "--mem", "256", "--json"])?;
    let started = microagent(bin, home, &["start", "src", "--json"])?;
    let cold_s = began.elapsed().as_secs_f64();
    let cold_ready_ms = ms(&started["runtime"]["ready_us"]).unwrap_or(f64::NAN);
    let src_pid = vmm_pid(&started)?;
    // src was fresh, so its VMM kept the image's warm snapshot: fresh
    // workspaces of the same shape now resume it.
    let mut warm = Vec::new();
    for i in 0..runs {
        let name = format!("w{i}");
        let t = Instant::now();
        microagent(bin, home, &["create", &name, "--mem", "256", "--json"])?;
        let meta = microagent(bin, home, &["start", &name, "--json"])?;
        if meta["runtime"]["start_kind"] != "warm" {
            bail!("{name} did not start warm: {meta}");
        }
        warm.push(t.elapsed().as_secs_f64() * 1000.0);
        microagent(bin, home, &["delete", &name, "--yes", "--force"])?;
    }
    // A few processes so memory holds more than a bare boot.
    microagent(bin, home, &["exec", "src", "--json", "--", "true"])?;

    let mut paused = Vec::new();
    let mut take_cmd = Vec::new();
    let mut sizes = Vec::new();
    for i in 0..runs {
        let t = Instant::now();
        let info = microagent(
            bin,
            home,
            &["snapshot", "take", "src", &format!("s{i}"), "--json"],
        )?;
        take_cmd.push(t.elapsed().as_secs_f64() * 1000.0);
        paused.push(info["paused_ms"].as_f64().unwrap_or(f64::NAN));
        sizes.push(info["size_bytes"].as_f64().unwrap_or(0.0) / f64::from(1 << 20));
    }

    // Restores on a quiet host: each fork is deleted before the next, as
    // a freshly restored guest keeps both host cores busy for a few
    // seconds (agent reconnect, new identity) and would slow the next.
    let mut vcpu_running = Vec::new();
    let mut ready = Vec::new();
    let mut fork_cmd = Vec::new();
    for i in 0..runs {
        let name = format!("r{i}");
        let t = Instant::now();
        let meta = microagent(
            bin,
            home,
            &["fork", "src", &name, "--snapshot", "s0", "--json"],
        )?;
        fork_cmd.push(t.elapsed().as_secs_f64() * 1000.0);
        vcpu_running.push(ms(&meta["runtime"]["vcpu_running_us"]).unwrap_or(f64::NAN));
        ready.push(ms(&meta["runtime"]["ready_us"]).unwrap_or(f64::NAN));
        microagent(bin, home, &["delete", &name, "--yes", "--force"])?;
    }
    // Then forks that stay, for their memory.
    let mut fork_pids = Vec::new();
    for i in 0..FORKS {
        let meta = microagent(
            bin,
            home,
            &[
                "fork",
                "src",
                &format!("f{i}"),
                "--snapshot",
                "s0",
                "--json",
            ],
        )?;
        fork_pids.push(vmm_pid(&meta)?);
    }
    // Each fork runs a command, as a used fork would.
    for i in 0..FORKS {
        microagent(
            bin,
            home,
            &["exec", &format!("f{i}"), "--json", "--", "true"],
        )?;
    }
    let src_pss = pss_kib(src_pid)? as f64 / 1024.0;
    let forks_pss: f64 = fork_pids
        .iter()
        .map(|&pid| pss_kib(pid).map(|k| k as f64 / 1024.0))
        .sum::<anyhow::Result<f64>>()?;

    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("snapshots of a 256 MiB, 1 vCPU workspace (minimal image), release binaries, {runs} runs; ms unless noted");
    println!("  reference: cold create+start to agent ready    {:>9.1} (VMM launch to agent {cold_ready_ms:.1})", cold_s * 1000.0);
    println!(
        "  snapshot take, guest paused                    {}",
        spread(paused.clone())
    );
    println!(
        "  snapshot take, whole CLI command               {}",
        spread(take_cmd)
    );
    println!(
        "  snapshot size on disk, MiB                     {}",
        spread(sizes)
    );
    println!(
        "  restore: VMM launch to vCPU running            {}",
        spread(vcpu_running.clone())
    );
    println!(
        "  restore: VMM launch to agent answering         {}",
        spread(ready.clone())
    );
    println!(
        "  fork from snapshot, whole CLI command          {}",
        spread(fork_cmd.clone())
    );
    println!(
        "  fork to agent ready vs cold start to ready     {:.1}x faster",
        cold_s * 1000.0 / median(fork_cmd)
    );
    println!(
        "  host memory (PSS): {FORKS} forks {forks_pss:.1} MiB vs the workspace they came from {src_pss:.1} MiB ({:.2}x)",
        forks_pss / src_pss
    );
    println!(
        "  warm create+start to agent ready               {}",
        spread(warm.clone())
    );
    println!(
        "  warm vs cold create+start                      {:.1}x faster",
        cold_s * 1000.0 / median(warm.clone())
    );
    println!("targets on this host:");
    println!(
        "  warm start at least 20x faster than cold: {} ({:.1}x)",
        verdict(cold_s * 1000.0 / median(warm.clone()) >= 20.0),
        cold_s * 1000.0 / median(warm)
    );
    println!(
        "  take under {TARGET_TAKE_MS} ms: {} ({:.1})",
        verdict(median(paused.clone()) < TARGET_TAKE_MS),
        median(paused)
    );
    println!(
        "  restore to vCPU running under {TARGET_RESTORE_MS} ms: {} ({:.1})",
        verdict(median(vcpu_running.clone()) < TARGET_RESTORE_MS),
        median(vcpu_running)
    );
    println!(
        "  {FORKS} forks under {TARGET_FORKS_PSS_RATIO}x one workspace's memory: {} ({:.2}x)",
        verdict(forks_pss / src_pss < TARGET_FORKS_PSS_RATIO),
        forks_pss / src_pss
    );
    Ok(())
}
