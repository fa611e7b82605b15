//! `cargo xtask dist`: the binaries as we ship them, in `target/dist/`:
//! `microagent` (release) and beside it `microagent-vmm`, the VMM process of
//! each workspace, built lean: static (no shared libraries mapped into every
//! VMM process), with link-time optimisation and optimised for size, so a
//! running workspace costs little beyond its guest RAM (`cargo xtask bench
//! vmm` measures it).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};

use crate::cache;

const PACKAGE: &str = "microagent";
const VMM_BINARY: &str = "microagent-vmm";
const TARGET: &str = "x86_64-unknown-linux-gnu";

/// Where `dist` leaves the binaries.
pub fn dir() -> PathBuf {
    cache::repo_root().join("target/dist")
}

/// Builds both binaries into [`dir`]; returns the path of `microagent`.
pub fn build() -> anyhow::Result<PathBuf> {
    let repo = cache::repo_root();
    crate::sh::run(
        Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "--quiet",
                "-p",
                PACKAGE,
                "--bin",
                PACKAGE,
            ])
            .current_dir(&repo),
    )?;
    // crt-static cannot apply to proc-macros, so the static build names its
    // target (host crates then build without it) and has a target dir of
    // its own, which keeps the main one's builds valid.
    let target_dir = cache::root()?.join("build").join("vmm-target");
    eprintln!("xtask: building {VMM_BINARY} (static, LTO, size-optimised)");
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            PACKAGE,
            "--bin",
            VMM_BINARY,
        ])
        .args(["--target", TARGET])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env("CARGO_PROFILE_RELEASE_LTO", "fat")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .current_dir(&repo)
        .status()
        .context("starting cargo")?;
    if !status.success() {
        bail!("building {VMM_BINARY} failed ({status}); cargo's errors are above");
    }
    let dist = dir();
    std::fs::create_dir_all(&dist).with_context(|| format!("creating {}", dist.display()))?;
    let copies = [
        (
            repo.join("target/release").join(PACKAGE),
            dist.join(PACKAGE),
        ),
        (
            target_dir.join(TARGET).join("release").join(VMM_BINARY),
            dist.join(VMM_BINARY),
        ),
    ];
    for (from, to) in copies {
        // Replaced by rename, so a running VMM keeps its old file.
        let tmp = to.with_extension("new");
        std::fs::copy(&from, &tmp)
            .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
        std::fs::rename(&tmp, &to).with_context(|| format!("installing {}", to.display()))?;
    }
    eprintln!(
        "xtask: {} holds {PACKAGE} and {VMM_BINARY}; install both into one directory on PATH",
        dist.display()
    );
    Ok(dist.join(PACKAGE))
}
