//! `cargo xtask dist`: the binaries as we ship them, in `target/dist/`:
//! `microagent` (release) and beside it `microagent-vmm`, the VMM process of
//! each workspace, built lean: static (no shared libraries mapped into every
//! VMM process), with link-time optimisation and optimised for size, so a
//! running workspace costs little beyond its guest RAM (`cargo xtask bench
//! vmm` measures it).

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;

use crate::cache;

const PACKAGE: &str = "microagent";
const VMM_BINARY: &str = "microagent-vmm";

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
    let vmm = cache::StaticBuild::new("vmm-target")?;
    eprintln!("xtask: building {VMM_BINARY} (static, LTO, size-optimised)");
    crate::sh::run(
        vmm.command(PACKAGE)
            .args(["--quiet", "--bin", VMM_BINARY])
            .env("CARGO_PROFILE_RELEASE_LTO", "fat")
            .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s"),
    )?;
    let dist = dir();
    std::fs::create_dir_all(&dist).with_context(|| format!("creating {}", dist.display()))?;
    let copies = [
        (
            repo.join("target/release").join(PACKAGE),
            dist.join(PACKAGE),
        ),
        (vmm.binary(VMM_BINARY), dist.join(VMM_BINARY)),
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
