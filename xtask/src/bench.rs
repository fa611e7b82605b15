//! `cargo xtask bench vmm`: whole-process VMM figures over several boots of
//! the test guest: process start to the first KVM_RUN, process start to the
//! init marker, and the VMM's resident memory beyond guest RAM; then the
//! resident memory of a running workspace's VMM process (`microagent-vmm`,
//! as `cargo xtask dist` builds it) beside the same VMM hosted in the
//! front-end binary (`microagent vmm boot`), measured in the same run.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use vmm_core::vcpu::monotonic_ns;

use crate::initramfs::INIT_MARKER;
use crate::{bench_workspace, dist, images, initramfs, kernel};

const MEM_MIB: &str = "64";
/// Most resident memory a workspace's VMM process may hold beyond guest RAM.
const TARGET_OVERHEAD_MIB: f64 = 2.5;

struct Sample {
    first_run_ms: f64,
    marker_s: f64,
    total_s: f64,
    overhead_rss_kib: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn stats(name: &str, unit: &str, v: Vec<f64>) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    println!(
        "{name:<34} median {:>10.3} {unit:<4} min {min:>10.3}  max {max:>10.3}",
        median(v)
    );
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let (args, against) = split_against(args)?;
    let runs: usize = match args.as_slice() {
        [what] if what == "vmm" => 3,
        [what, flag, n] if what == "vmm" && flag == "--runs" => {
            n.parse().context("--runs takes a number")?
        }
        _ => bail!("usage: cargo xtask bench vmm [--runs N] [--against DIST_DIR]"),
    };
    let profile = vmm_core::host::probe()?;
    let variant = profile.kernel_variant();
    let vmlinux = kernel::build(variant)?;
    let initrd = initramfs::build()?;
    let bin = dist::build()?;
    println!(
        "host: KVM {} ({:.1} ns per ring-0 loop iteration, probe {:.1} ms); template {}; {MEM_MIB} MiB, 1 vCPU; {runs} runs",
        profile.mode.name(),
        profile.ring0_ns_per_iteration,
        profile.probe_time.as_secs_f64() * 1e3,
        profile.cpu_template()
    );
    let mut samples = Vec::new();
    for i in 0..runs {
        let start = monotonic_ns();
        let mut child = Command::new(&bin)
            .args([
                "vmm",
                "boot",
                "--json",
                "--timeout",
                "300",
                "--mem-mib",
                MEM_MIB,
                "--cpu-template",
                profile.cpu_template().name(),
                "--kernel",
            ])
            .arg(&vmlinux)
            .arg("--initrd")
            .arg(&initrd)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut marker_ns = None;
        let mut summary = None;
        for line in BufReader::new(child.stdout.take().context("no stdout")?).lines() {
            let line = line?;
            if marker_ns.is_none() && line.contains(INIT_MARKER) {
                marker_ns = Some(monotonic_ns());
            }
            if line.starts_with('{') {
                summary = Some(serde_json::from_str::<serde_json::Value>(&line)?);
            }
        }
        let status = child.wait()?;
        let total_s = (monotonic_ns() - start) as f64 / 1e9;
        let summary = summary.context("the VMM printed no JSON summary")?;
        if !status.success() {
            bail!("run {i}: the guest did not stop cleanly: {summary}");
        }
        let first_run = summary["first_kvm_run_monotonic_ns"]
            .as_u64()
            .context("no first_kvm_run time")?;
        let sample = Sample {
            first_run_ms: (first_run - start) as f64 / 1e6,
            marker_s: (marker_ns.context("the init marker never appeared")? - start) as f64 / 1e9,
            total_s,
            overhead_rss_kib: summary["overhead_rss_kib"].as_u64().unwrap_or(0),
        };
        println!(
            "run {}: first KVM_RUN {:.2} ms, init marker {:.2} s, exit {:.2} s, VMM RSS beyond guest RAM {} KiB",
            i + 1,
            sample.first_run_ms,
            sample.marker_s,
            sample.total_s,
            sample.overhead_rss_kib
        );
        samples.push(sample);
    }
    stats(
        "process start -> first KVM_RUN",
        "ms",
        samples.iter().map(|s| s.first_run_ms).collect(),
    );
    stats(
        "process start -> init marker",
        "s",
        samples.iter().map(|s| s.marker_s).collect(),
    );
    stats(
        "process start -> guest rebooted",
        "s",
        samples.iter().map(|s| s.total_s).collect(),
    );
    let hosted: Vec<f64> = samples
        .iter()
        .map(|s| s.overhead_rss_kib as f64 / 1024.0)
        .collect();
    stats("VMM RSS beyond guest RAM", "MiB", hosted.clone());
    images::run(&["minimal".to_string()])?;
    let lean = workspace_vmm(&bin)?;
    println!(
        "workspace VMM process (microagent-vmm, {MEM_MIB} MiB guest, after boot and one exec): {:.2} MiB resident beyond guest RAM, {} threads; target at most {TARGET_OVERHEAD_MIB} MiB",
        lean.overhead_kib as f64 / 1024.0,
        lean.threads
    );
    println!(
        "  reference, same run: the VMM hosted in the front-end binary (`microagent vmm boot` of the test initramfs above), median {:.2} MiB",
        median(hosted)
    );
    if lean.overhead_kib as f64 / 1024.0 > TARGET_OVERHEAD_MIB {
        println!("  ABOVE TARGET");
    }
    if let Some(other) = against {
        other.use_its_assets();
        let theirs = workspace_vmm(&other.microagent())?;
        println!(
            "  against, same run: {}'s workspace VMM process, {:.2} MiB resident beyond guest RAM, {} threads",
            other.dist.display(),
            theirs.overhead_kib as f64 / 1024.0,
            theirs.threads
        );
    }
    Ok(())
}

/// Another build measured in the same run as a reference: its `cargo
/// xtask dist` output, and the asset cache its own `cargo xtask` filled
/// (`--against-cache DIR`): an older build's agent need not speak today's
/// protocol, so its images (and kernel) are its own.
pub struct Against {
    pub dist: std::path::PathBuf,
    cache: Option<std::path::PathBuf>,
}

impl Against {
    /// Its `microagent`.
    pub fn microagent(&self) -> std::path::PathBuf {
        self.dist.join("microagent")
    }

    /// Points the commands started from now on at its asset cache (a
    /// bench measures the builds one after the other, and nothing of this
    /// build runs after it).
    pub fn use_its_assets(&self) {
        if let Some(cache) = &self.cache {
            std::env::set_var("MICROAGENT_CACHE", cache);
        }
    }
}

/// `--against DIST_DIR [--against-cache DIR]` taken out of `args`.
pub fn split_against(args: &[String]) -> anyhow::Result<(Vec<String>, Option<Against>)> {
    let mut rest = Vec::new();
    let (mut dist, mut cache) = (None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--against" {
            let dir = std::path::PathBuf::from(it.next().context("--against takes a directory")?);
            if !dir.join("microagent").is_file() || !dir.join("microagent-vmm").is_file() {
                bail!(
                    "{} holds no microagent and microagent-vmm (the output of `cargo xtask dist`)",
                    dir.display()
                );
            }
            dist = Some(dir);
        } else if a == "--against-cache" {
            let dir =
                std::path::PathBuf::from(it.next().context("--against-cache takes a directory")?);
            if !dir.join("current").is_dir() {
                bail!(
                    "{} has no current/ (an asset cache the other build's `cargo xtask` filled)",
                    dir.display()
                );
            }
            cache = Some(std::path::absolute(&dir)?);
        } else {
            rest.push(a.clone());
        }
    }
    match (dist, cache) {
        (None, Some(_)) => bail!("--against-cache goes with --against"),
        (dist, cache) => Ok((rest, dist.map(|dist| Against { dist, cache }))),
    }
}

/// What a running workspace's VMM process holds.
struct Resident {
    overhead_kib: u64,
    threads: u64,
}

/// Runs one workspace ({MEM_MIB} MiB guest) through the CLI `bin` and
/// measures its VMM process once the agent has answered and run a command.
fn workspace_vmm(bin: &Path) -> anyhow::Result<Resident> {
    let home = std::env::temp_dir().join(format!("ma-bench-vmm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let cli = |args: &[&str]| bench_workspace::microagent(bin, &home, args);
    let measured = (|| {
        cli(&["create", "bench", "--mem", MEM_MIB, "--json"])?;
        let started = cli(&["start", "bench", "--json"])?;
        cli(&["exec", "bench", "--json", "--", "true"])?;
        let pid = started["runtime"]["pid"]
            .as_u64()
            .context("start reported no VMM pid")?;
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))
            .context("reading the VMM's smaps")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .context("reading the VMM's status")?;
        let guest_bytes = MEM_MIB.parse::<u64>()? << 20;
        let guest = mappings_of_size(&smaps, guest_bytes);
        if guest.len() != 1 {
            bail!("expected one {MEM_MIB} MiB guest RAM mapping in the VMM, found {guest:x?}");
        }
        let threads = status
            .lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        Ok(Resident {
            overhead_kib: vmm_core::stats::rss_excluding(&smaps, &guest),
            threads,
        })
    })();
    let _ = cli(&["delete", "bench", "--force", "--yes", "--json"]);
    let _ = std::fs::remove_dir_all(&home);
    measured
}

/// Start addresses of the mappings in `smaps` exactly `bytes` long.
fn mappings_of_size(smaps: &str, bytes: u64) -> Vec<u64> {
    smaps
        .lines()
        .filter_map(|line| {
            let range = line.split_whitespace().next()?;
            let (start, end) = range.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            (end.checked_sub(start) == Some(bytes)).then_some(start)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_guest_mapping_by_size() {
        let smaps = "\
55d0c0000000-55d0c0100000 r-xp 00000000 08:01 123 /usr/bin/microagent-vmm
Rss:                 800 kB
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
Rss:               30000 kB
";
        assert_eq!(mappings_of_size(smaps, 64 << 20), vec![0x7f00_0000_0000]);
        assert!(mappings_of_size(smaps, 1 << 20).len() == 1);
        assert!(mappings_of_size(smaps, 3).is_empty());
    }
}
