//! `cargo xtask bench servers [--runs N]`: the cost of `microagent exec
//! WS -- true` on a workspace on a remote server (reached through Debian's
//! sshd on a loopback port, over the shared connection) beside the same on
//! a workspace of this host, in the same run, with the shipped binaries.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use testkit::sshd::Sshd;

use crate::{dist, images, kernel, sh};

/// A fresh private state directory.
pub(crate) fn home(name: &str) -> anyhow::Result<PathBuf> {
    let dir = PathBuf::from(format!("/tmp/ma-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&dir)
        .with_context(|| format!("making {}", dir.display()))?;
    Ok(dir)
}

pub(crate) fn microagent(bin: &Path, home: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(bin)
        .args(args)
        .env("MICROAGENT_HOME", home)
        .output()
        .context("running microagent")?;
    if !out.status.success() {
        bail!(
            "microagent {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn timed(bin: &Path, home: &Path, args: &[&str]) -> anyhow::Result<f64> {
    let start = Instant::now();
    microagent(bin, home, args)?;
    Ok(start.elapsed().as_secs_f64())
}

fn show(label: &str, mut v: Vec<f64>, reference: f64) {
    v.sort_by(f64::total_cmp);
    let median = v[v.len() / 2];
    println!(
        "  {label:<40} median {:>7.1} ms  (min {:.1}, max {:.1}, {} runs)  {:.2}x local",
        median * 1e3,
        v[0] * 1e3,
        v[v.len() - 1] * 1e3,
        v.len(),
        median / reference
    );
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let runs: usize = match args {
        [] => 20,
        [flag, n] if flag == "--runs" => n.parse().context("--runs takes a number")?,
        _ => bail!("usage: cargo xtask bench servers [--runs N]"),
    };
    sh::ensure_debs(&["openssh-client", "openssh-server"])?;
    kernel::build(kernel::variant_for_host()?)?;
    images::run(&["minimal".to_string()])?;
    let bin = dist::build()?;
    if let Some(why) = testkit::sshd::missing() {
        bail!("{why}");
    }
    let (here, there) = (home("srv-here")?, home("srv-there")?);
    let sshd = Sshd::start(&here.join("sshd"));
    let key = sshd.client_key().display().to_string();
    let (target, state_dir) = (sshd.target(), there.display().to_string());
    let bin_text = bin.display().to_string();
    let mut add = vec![
        "server",
        "add",
        "remote1",
        "--ssh",
        &target,
        "--identity",
        &key,
        "--state-dir",
        &state_dir,
        "--remote-binary",
        &bin_text,
    ];
    let options = sshd.client_options();
    for option in &options {
        add.extend(["--ssh-option", option.as_str()]);
    }
    microagent(&bin, &here, &add)?;
    microagent(&bin, &here, &["create", "lw", "--server", "local"])?;
    microagent(&bin, &here, &["start", "lw"])?;
    microagent(&bin, &here, &["create", "rw", "--server", "remote1"])?;
    microagent(&bin, &here, &["start", "rw"])?;
    let (mut local, mut forwarded) = (Vec::new(), Vec::new());
    // One of each first: the guests' caches and the shared connection.
    timed(&bin, &here, &["exec", "lw", "--", "true"])?;
    timed(&bin, &here, &["exec", "rw", "--", "true"])?;
    for _ in 0..runs {
        local.push(timed(&bin, &here, &["exec", "lw", "--", "true"])?);
        forwarded.push(timed(&bin, &here, &["exec", "rw", "--", "true"])?);
    }
    for name in ["lw", "rw"] {
        microagent(&bin, &here, &["delete", name, "--yes", "--force"])?;
    }
    microagent(&bin, &here, &["server", "rm", "remote1"])?;
    drop(sshd);
    let mut sorted = local.clone();
    sorted.sort_by(f64::total_cmp);
    let reference = sorted[sorted.len() / 2];
    println!("microagent exec WS -- true, whole command (the CLI started each time)");
    show("workspace on this host, reference", local, reference);
    show("workspace on server remote1 (ssh)", forwarded, reference);
    let _ = std::fs::remove_dir_all(&here);
    let _ = std::fs::remove_dir_all(&there);
    Ok(())
}
