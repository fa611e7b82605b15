//! `cargo xtask dist`: the binaries as we ship them, in `target/dist/`:
//! `microagent` (release; with `--with containerd` containerd's shim
//! `containerd-shim-microagent-v2` too, which `microagent run` never
//! needs and which is most of a first build), and beside them
//! `microagent-vmm`, the VMM process of each workspace, built lean:
//! static (no shared libraries mapped into every VMM process), with
//! link-time optimisation and optimised for size, so a
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
const SHIM_PACKAGE: &str = "containerd-shim-microagent";
const SHIM_BINARY: &str = "containerd-shim-microagent-v2";
use workspace::images::build::minimal::{AGENT_BINARY, INIT_BINARY};
const INIT_SOURCE: &str = "guest/init/init.c";

/// Writes an executable by rename, so a running copy keeps its old file.
fn write_new(to: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = to.with_extension("new");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, to).with_context(|| format!("installing {}", to.display()))
}

/// The environment variables of the library's test hooks (the
/// `test-hooks` feature): a shipped binary must not react to them.
const TEST_HOOK_VARS: [&str; 2] = [
    "MICROAGENT_TEST_PAUSE_AT",
    "MICROAGENT_TEST_REFUSED_SYSCALL_AT",
];

/// Fails when `binary` holds a test hook's variable name (the
/// `test-hooks` feature reached a shipped build).
fn refuse_test_hooks(binary: &std::path::Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    for var in TEST_HOOK_VARS {
        if bytes.windows(var.len()).any(|w| w == var.as_bytes()) {
            anyhow::bail!(
                "{} was built with the test-hooks feature (it holds {var}); shipped builds must not be",
                binary.display()
            );
        }
    }
    Ok(())
}

/// Writes the guest's agent (static) and init (nolibc) into `dir`.
pub fn guest_helpers(dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let agent = crate::images::agent::find()?;
    write_new(&dir.join(AGENT_BINARY), &agent.bytes)?;
    let work = cache::root()?.join("build").join("dist-init");
    std::fs::create_dir_all(&work)?;
    let init = crate::nolibc::build(&work, &[&cache::repo_root().join(INIT_SOURCE)]);
    let _ = std::fs::remove_dir_all(&work);
    write_new(&dir.join(INIT_BINARY), &init?.remove(0))
}

/// Where `dist` leaves the binaries.
pub fn dir() -> PathBuf {
    cache::repo_root().join("target/dist")
}

/// The binaries a bundle's `bin/` holds, as `dist` names them.
pub const BINARIES: [&str; 3] = [PACKAGE, VMM_BINARY, SHIM_BINARY];

/// Builds `microagent`, the VMM and the guest's helpers into [`dir`] (what
/// `microagent run` needs); returns the path of `microagent`.
pub fn build() -> anyhow::Result<PathBuf> {
    build_with(false)
}

/// [`build`], and containerd's shim beside them.
pub fn build_with_shim() -> anyhow::Result<PathBuf> {
    build_with(true)
}

fn build_with(shim: bool) -> anyhow::Result<PathBuf> {
    let repo = cache::repo_root();
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            PACKAGE,
            "--bin",
            PACKAGE,
        ])
        .current_dir(&repo);
    if shim {
        cargo.args(["-p", SHIM_PACKAGE, "--bin", SHIM_BINARY]);
    }
    crate::sh::run(&mut cargo)?;
    let vmm = cache::StaticBuild::new("vmm-target")?;
    eprintln!("xtask: building {VMM_BINARY} (static, LTO, size-optimised)");
    crate::sh::run(
        vmm.command(VMM_BINARY)
            .args(["--quiet", "--bin", VMM_BINARY])
            .env("CARGO_PROFILE_RELEASE_LTO", "fat")
            .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s"),
    )?;
    let dist = dir();
    guest_helpers(&dist)?;
    let release = cache::target_dir().join("release");
    let mut copies = vec![
        (release.join(PACKAGE), PACKAGE),
        (vmm.binary(VMM_BINARY), VMM_BINARY),
    ];
    if shim {
        copies.push((release.join(SHIM_BINARY), SHIM_BINARY));
    }
    for (from, name) in &copies {
        // Replaced by rename, so a running VMM keeps its old file.
        let to = dist.join(name);
        let tmp = to.with_extension("new");
        std::fs::copy(from, &tmp)
            .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
        std::fs::rename(&tmp, &to).with_context(|| format!("installing {}", to.display()))?;
        refuse_test_hooks(&to)?;
    }
    let shim_said = if shim {
        format!(", {SHIM_BINARY} (containerd finds its shim on PATH)")
    } else {
        String::new()
    };
    eprintln!(
        "xtask: {} holds {PACKAGE}, {VMM_BINARY}, {AGENT_BINARY} and {INIT_BINARY}{shim_said}; install them into one directory on PATH, or make the release bundle (`dist --bundle`)",
        dist.display()
    );
    Ok(dist.join(PACKAGE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_names_checked_are_the_librarys() {
        let source = cache::repo_root().join("crates/base/src/pause_point.rs");
        let text = std::fs::read_to_string(source).unwrap();
        for var in TEST_HOOK_VARS {
            assert!(text.contains(&format!("\"{var}\"")), "{var}");
        }
    }

    #[test]
    fn a_binary_with_a_hook_name_is_refused() {
        let dir = std::env::temp_dir().join(format!("xtask-dist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let clean = dir.join("clean");
        std::fs::write(&clean, b"\x7fELF MICROAGENT_HOME").unwrap();
        assert!(refuse_test_hooks(&clean).is_ok());
        let hooked = dir.join("hooked");
        std::fs::write(&hooked, b"\x7fELF\0MICROAGENT_TEST_PAUSE_AT\0").unwrap();
        assert!(refuse_test_hooks(&hooked).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
