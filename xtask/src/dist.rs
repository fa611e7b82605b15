//! `cargo xtask dist`: the binaries as we ship them, in `target/dist/`:
//! `microagent` (release) and beside it `microagent-vmm`, the VMM process of
//! each workspace, built lean: static (no shared libraries mapped into every
//! VMM process), with link-time optimisation and optimised for size, so a
//! running workspace costs little beyond its guest RAM (`cargo xtask bench
//! vmm` measures it); and the guest's `microagent-agent` (static) and
//! `microagent-init` (nolibc), which `microagent setup` builds the
//! `minimal` image from.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;

use crate::cache;

const PACKAGE: &str = "microagent";
const VMM_BINARY: &str = "microagent-vmm";
use workspace::image_build::minimal::{AGENT_BINARY, INIT_BINARY};
const INIT_SOURCE: &str = "guest/init/init.c";

/// Writes an executable by rename, so a running copy keeps its old file.
fn write_new(to: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = to.with_extension("new");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, to).with_context(|| format!("installing {}", to.display()))
}

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
    let agent = crate::images::agent::find()?;
    write_new(&dist.join(AGENT_BINARY), &agent.bytes)?;
    let work = cache::root()?.join("build").join("dist-init");
    std::fs::create_dir_all(&work)?;
    let init = crate::nolibc::build(&work, &[&repo.join(INIT_SOURCE)]);
    let _ = std::fs::remove_dir_all(&work);
    write_new(&dist.join(INIT_BINARY), &init?.remove(0))?;
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
        "xtask: {} holds {PACKAGE}, {VMM_BINARY}, {AGENT_BINARY} and {INIT_BINARY}; install them into one directory on PATH",
        dist.display()
    );
    Ok(dist.join(PACKAGE))
}
