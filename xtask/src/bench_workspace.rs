//! `cargo xtask bench workspace [--runs N]`: the life cycle as a user sees
//! it, through the `microagent` binary: create, start (boot until the agent
//! answers), exec `true`, stop, delete; with the VMM's resident memory and
//! the host disk a fresh workspace uses.

use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::{cache, images, kernel};

struct Run {
    phases: Vec<(&'static str, f64)>,
    vmm_rss_mib: f64,
    disk_kib: u64,
}

/// A fresh, private state directory for one bench run, `/tmp/ma-<tag>-<pid>`:
/// short, since workspace sockets live under it, and 0700, as the library
/// demands of a state directory.
pub fn private_home(tag: &str) -> anyhow::Result<std::path::PathBuf> {
    let home = std::path::PathBuf::from(format!("/tmp/ma-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&home)?;
    Ok(home)
}

/// Runs `microagent ARGS` with the state directory `home`; its JSON output
/// (null when it printed none), or an error with its stderr.
pub fn microagent(
    bin: &std::path::Path,
    home: &std::path::Path,
    args: &[&str],
) -> anyhow::Result<serde_json::Value> {
    let stdout = microagent_output(bin, home, args)?;
    Ok(serde_json::from_slice(&stdout).unwrap_or(serde_json::Value::Null))
}

/// Runs `microagent ARGS` with the state directory `home`; its stdout, or
/// an error with its stderr.
pub fn microagent_output(
    bin: &std::path::Path,
    home: &std::path::Path,
    args: &[&str],
) -> anyhow::Result<Vec<u8>> {
    let out = Command::new(bin)
        .args(args)
        .env("MICROAGENT_HOME", home)
        .output()
        .with_context(|| format!("running microagent {args:?}"))?;
    if !out.status.success() {
        bail!(
            "microagent {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

fn one_run(bin: &std::path::Path, home: &std::path::Path) -> anyhow::Result<Run> {
    let mut phases = Vec::new();
    let mut timed = |name: &'static str, args: &[&str]| -> anyhow::Result<serde_json::Value> {
        let t = Instant::now();
        let v = microagent(bin, home, args)?;
        phases.push((name, t.elapsed().as_secs_f64()));
        Ok(v)
    };
    timed("create", &["create", "bench", "--json"])?;
    let started = timed("start", &["start", "bench", "--json"])?;
    timed("exec true", &["exec", "bench", "--json", "--", "true"])?;
    let pid = started["runtime"]["pid"].as_u64().unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    let info = timed("inspect", &["inspect", "bench", "--json"])?;
    timed("stop", &["stop", "bench", "--json"])?;
    timed("delete", &["delete", "bench", "--yes", "--json"])?;
    Ok(Run {
        phases,
        vmm_rss_mib: rss_kib / 1024.0,
        disk_kib: info["disk_used_bytes"].as_u64().unwrap_or(0) / 1024,
    })
}

fn spread(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    format!(
        "min {:>8.3}  median {:>8.3}  max {:>8.3}",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let runs: usize = match args {
        [] => 2,
        [flag, n] if flag == "--runs" => n.parse().context("--runs takes a number")?,
        _ => bail!("usage: cargo xtask bench workspace [--runs N]"),
    };
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let bin = cache::build_microagent()?;
    let home = std::path::PathBuf::from(format!("/tmp/ma-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let mut all = Vec::new();
    for i in 0..runs {
        eprintln!("xtask: workspace run {}/{runs}", i + 1);
        let run = one_run(&bin, &home);
        if run.is_err() {
            let _ = microagent(&bin, &home, &["delete", "bench", "--yes", "--force"]);
        }
        all.push(run?);
    }
    let _ = std::fs::remove_dir_all(&home);
    println!("workspace life cycle through the CLI, {runs} runs, seconds:");
    for (i, (name, _)) in all[0].phases.iter().enumerate() {
        println!(
            "  {name:<10} {}",
            spread(all.iter().map(|r| r.phases[i].1).collect())
        );
    }
    println!(
        "  VMM RSS while running (256 MiB guest): {}",
        spread(all.iter().map(|r| r.vmm_rss_mib).collect()) + " MiB"
    );
    println!(
        "  host disk of a fresh workspace after boot: {} KiB (sparse 1 GiB disk)",
        all[0].disk_kib
    );
    Ok(())
}
