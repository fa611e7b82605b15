//! Running external commands with clear errors.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

/// The installed version of a Debian package (the product's own lookup).
pub use workspace::host::settings::deb_version;

/// Runs `cmd`, failing with its command line when it does not succeed.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

/// Makes sure Debian `packages` are installed, installing the missing ones
/// with apt-get (which needs root: otherwise says what to run).
pub fn ensure_debs(packages: &[&str]) -> anyhow::Result<()> {
    let missing = workspace::host::settings::missing_debs(packages);
    if missing.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        bail!(
            "missing Debian packages: {}; install them with: sudo apt-get install -y {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Writes `bytes` to `path` atomically (temp file in the same directory, then rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}
