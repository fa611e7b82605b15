//! Tiny static guest programs built against the kernel's nolibc (a few KB
//! each: every page and process costs seconds where kernel mode is emulated).

use std::path::Path;
use std::process::Command;

use crate::sh;

const SOURCE_TARBALL: &str = "/usr/src/linux-source-6.1.tar.xz";
const NOLIBC_IN_TARBALL: &str = "linux-source-6.1/tools/include/nolibc";

/// Debian packages the build needs.
pub const PACKAGES: &[&str] = &["build-essential", "linux-source-6.1", "xz-utils"];

/// Compiles `sources` (each a C file with a `main`) into static binaries in
/// `work`, named after the sources; returns their bytes in order.
pub fn build(work: &Path, sources: &[&Path]) -> anyhow::Result<Vec<Vec<u8>>> {
    sh::ensure_debs(PACKAGES)?;
    if !work.join(NOLIBC_IN_TARBALL).is_dir() {
        sh::run(
            Command::new("tar")
                .args(["-xf", SOURCE_TARBALL, "-C"])
                .arg(work)
                .arg(NOLIBC_IN_TARBALL),
        )?;
    }
    let mut out = Vec::new();
    for src in sources {
        let bin = work.join(src.file_stem().unwrap_or_default());
        sh::run(
            Command::new("gcc")
                .args([
                    "-static",
                    "-nostdlib",
                    "-Os",
                    "-s",
                    "-fno-stack-protector",
                    "-fno-asynchronous-unwind-tables",
                    "-fno-ident",
                    "-Wall",
                    "-Werror",
                ])
                .arg("-I")
                .arg(work.join(NOLIBC_IN_TARBALL))
                .args(["-include", "nolibc.h", "-o"])
                .arg(&bin)
                .arg(src)
                .arg("-lgcc"),
        )?;
        out.push(std::fs::read(&bin)?);
    }
    Ok(out)
}
