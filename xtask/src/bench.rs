//! `cargo xtask bench vmm`: whole-process VMM figures over several boots of
//! the test guest: process start to the first KVM_RUN, process start to the
//! init marker, and the VMM's resident memory beyond guest RAM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use vmm_core::vcpu::monotonic_ns;

use crate::initramfs::INIT_MARKER;
use crate::{cache, initramfs, kernel, sh};

const MEM_MIB: &str = "64";

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
    let runs: usize = match args {
        [what] if what == "vmm" => 3,
        [what, flag, n] if what == "vmm" && flag == "--runs" => {
            n.parse().context("--runs takes a number")?
        }
        _ => bail!("usage: cargo xtask bench vmm [--runs N]"),
    };
    let profile = vmm_core::host::probe()?;
    let variant = profile.kernel_variant();
    let vmlinux = kernel::build(variant)?;
    let initrd = initramfs::build()?;
    sh::run(
        Command::new(env!("CARGO"))
            .args(["build", "--release", "--quiet", "-p", "microagent"])
            .current_dir(cache::repo_root()),
    )?;
    let bin = cache::repo_root().join("target/release/microagent");
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
    stats(
        "VMM RSS beyond guest RAM",
        "MiB",
        samples
            .iter()
            .map(|s| s.overhead_rss_kib as f64 / 1024.0)
            .collect(),
    );
    Ok(())
}
