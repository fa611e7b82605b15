//! `cargo xtask bench containerd [--runs N]`: `ctr run` to the container's
//! first line of output through microagent's shim, cold (the first
//! container of an image: its root filesystem converted and the guest
//! booted) and warm (later containers resume the image's warm snapshot),
//! beside containerd's own runc shim on the same image, in the same run
//! and against the same containerd (Debian's, started for the bench).

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{bail, Context};
use testkit::containerd::{Containerd, RUNC_RUNTIME, RUNTIME};

use crate::{dist, images, kernel, sh};

/// The shim as `dist` ships it.
const SHIM_BINARY: &str = "containerd-shim-microagent-v2";

/// Seconds from `ctr run` to the container's first line of output, and
/// that line.
fn run_to_output(ctrd: &Containerd, runtime: &str, image: &str, id: &str) -> anyhow::Result<f64> {
    let start = Instant::now();
    let mut child = ctrd
        .ctr_command(&[
            "run",
            "--rm",
            "--runtime",
            runtime,
            image,
            id,
            "busybox",
            "echo",
            "ready",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running ctr")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("no stdout")?).read_line(&mut line)?;
    let secs = start.elapsed().as_secs_f64();
    let out = child.wait_with_output()?;
    if line.trim() != "ready" || !out.status.success() {
        bail!(
            "{runtime}: the container printed {line:?} and ended {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(secs)
}

fn show(label: &str, mut v: Vec<f64>, reference: f64) {
    v.sort_by(f64::total_cmp);
    let median = v[v.len() / 2];
    println!(
        "  {label:<44} median {median:>8.3} s  (min {:.3}, max {:.3}, {} runs)  {:.1}x runc",
        v[0],
        v[v.len() - 1],
        v.len(),
        median / reference
    );
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let runs: usize = match args {
        [] => 5,
        [flag, n] if flag == "--runs" => n.parse().context("--runs takes a number")?,
        _ => bail!("usage: cargo xtask bench containerd [--runs N]"),
    };
    sh::ensure_debs(&["containerd"])?;
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let shim = dist::build_with_shim()?.with_file_name(SHIM_BINARY);
    if let Some(why) = testkit::containerd::missing() {
        bail!("{why}");
    }
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut runc = Vec::new();
    // Each containerd has a fresh microagent state directory: its first
    // container converts the image and boots.
    for round in 0..2 {
        let ctrd = Containerd::start(&format!("bench{round}"), &shim);
        let image = ctrd.import_test_image();
        cold.push(run_to_output(&ctrd, RUNTIME, &image, "cold")?);
        for i in 0..runs / 2 + 1 {
            warm.push(run_to_output(&ctrd, RUNTIME, &image, &format!("warm{i}"))?);
            runc.push(run_to_output(
                &ctrd,
                RUNC_RUNTIME,
                &image,
                &format!("runc{i}"),
            )?);
        }
    }
    let mut reference = runc.clone();
    reference.sort_by(f64::total_cmp);
    let reference = reference[reference.len() / 2];
    println!("ctr run --rm IMAGE ID busybox echo ready: start to the first line of output");
    show(
        "runc shim (io.containerd.runc.v2), reference",
        runc,
        reference,
    );
    show("microagent shim, warm (warm snapshot)", warm, reference);
    show("microagent shim, cold (convert + boot)", cold, reference);
    Ok(())
}
