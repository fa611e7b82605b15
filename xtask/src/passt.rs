//! A `passt` without the bulk-upload reset, for hosts whose Debian ships an
//! older one (Debian 12: snapshot 2023-03-09).
//!
//! Snapshots before upstream commit 4e73e9b (2023-03-27) reset a guest's
//! TCP connection once its peer has sent nothing for ~24 s, so any upload
//! from a workspace on the default `user` network longer than that dies
//! (docs/networking.md, "passt versions"). Debian 13's passt is fixed but
//! needs a newer libc than Debian 12 has, so we build Debian 13's source
//! (libc only, ~20 s) and install it to /usr/local/bin, where microagent
//! looks before /usr/bin.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

use crate::{cache, sh};

/// The Debian 13 source package we build, and its upstream tarball.
const SOURCE_PACKAGE: &str = "passt=0.0~git20250503.587980c-2+deb13u1";
const VERSION: &str = "0.0~git20250503.587980c";
/// The cache key: the version and the build steps' revision.
const CACHE_KEY: &str = "0.0~git20250503.587980c-avx2";
const TARBALL: &str = "passt_0.0~git20250503.587980c.orig.tar.xz";
/// Pinned: the tarball is checked against this before it is unpacked.
const TARBALL_SHA256: &str = "69d5eb843f7d648c2cc60bfbca6ea7b5014c6b6f07cdee362c2a8cf490515a49";
/// Where the build goes; microagent's host tool lookup tries it first.
const INSTALL_DIR: &str = "/usr/local/bin";
/// Debian's archive, for the one source package (a private sources list:
/// the host's apt configuration is not changed).
const SOURCES: &str = "deb-src http://deb.debian.org/debian trixie main\n";

/// Makes sure the passt microagent will run has the fix: nothing to do when
/// the installed one is new enough, else build and install ours.
pub fn ensure_fixed() -> anyhow::Result<()> {
    if let Some(date) = installed_snapshot() {
        if date >= workspace::network::PASST_FIXED_SNAPSHOT {
            return Ok(());
        }
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        // Not fatal: everything but long uploads works with the old one.
        eprintln!(
            "xtask: warning: the installed passt resets uploads longer than ~24 s (docs/networking.md); run `cargo xtask setup` as root to build and install a fixed one in {INSTALL_DIR}"
        );
        return Ok(());
    }
    let built = cache::cached_file("passt", CACHE_KEY, "passt", build)?;
    std::fs::create_dir_all(INSTALL_DIR)?;
    // The AVX2 variant first: `passt` looks for it when it starts.
    for name in ["passt.avx2", "passt"] {
        let target = Path::new(INSTALL_DIR).join(name);
        let tmp = target.with_extension("microagent-tmp");
        let from = built.with_file_name(name);
        std::fs::copy(&from, &tmp).with_context(|| format!("copying to {}", tmp.display()))?;
        std::fs::rename(&tmp, &target)?;
    }
    eprintln!("xtask: installed passt {VERSION} (Debian 13's source) in {INSTALL_DIR}");
    Ok(())
}

/// The snapshot date of the passt microagent would run, when known.
fn installed_snapshot() -> Option<u32> {
    let path = workspace::network::passt_binary()?;
    workspace::network::passt_snapshot(&path)
}

fn build(work: &Path, partial: &Path) -> anyhow::Result<()> {
    eprintln!("xtask: building passt {VERSION} from Debian 13's source (the installed one resets long uploads)");
    let tarball = download(work)?;
    let digest = Sha256::digest(std::fs::read(&tarball)?);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    if hex != TARBALL_SHA256 {
        bail!("{TARBALL}: sha256 {hex}, expected {TARBALL_SHA256}");
    }
    sh::run(
        Command::new("tar")
            .arg("xf")
            .arg(&tarball)
            .current_dir(work),
    )?;
    let src = std::fs::read_dir(work)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("passt-"))
        })
        .context("the passt tarball has no passt-* directory")?;
    // `passt` runs its `.avx2` sibling where the CPU has AVX2 (and says so
    // when it is missing): both are installed.
    sh::run(
        Command::new("make")
            .args(["passt", "passt.avx2", &format!("VERSION={VERSION}")])
            .current_dir(&src),
    )?;
    let dir = partial
        .parent()
        .context("the cache entry has no directory")?;
    std::fs::copy(src.join("passt.avx2"), dir.join("passt.avx2"))?;
    std::fs::copy(src.join("passt"), partial)?;
    Ok(())
}

/// Downloads the upstream tarball with apt, from a private sources list.
fn download(work: &Path) -> anyhow::Result<PathBuf> {
    let apt = work.join("apt");
    std::fs::create_dir_all(apt.join("lists/partial"))?;
    let list = apt.join("sources.list");
    std::fs::write(&list, SOURCES)?;
    let opts = [
        format!("Dir::Etc::sourcelist={}", list.display()),
        "Dir::Etc::sourceparts=-".to_owned(),
        format!("Dir::State::Lists={}", apt.join("lists").display()),
        // Root downloads into our own directory, which `_apt` cannot write.
        "APT::Sandbox::User=root".to_owned(),
    ];
    let with_opts = |cmd: &mut Command| {
        for o in &opts {
            cmd.arg("-o").arg(o);
        }
    };
    let mut update = Command::new("apt-get");
    update.arg("-qq");
    with_opts(&mut update);
    sh::run(update.arg("update"))?;
    let mut source = Command::new("apt-get");
    source.arg("-qq");
    with_opts(&mut source);
    sh::run(
        source
            .args(["source", "--download-only", "--tar-only", SOURCE_PACKAGE])
            .current_dir(work),
    )?;
    Ok(work.join(TARBALL))
}
