//! `cargo xtask initramfs`: the test initramfs. An uncompressed newc cpio
//! (the kernel inflating gzip costs over a minute on emulating hosts) with
//! `/dev/console`, a few-KB init built against the kernel's nolibc, and
//! Debian's static busybox providing `/bin/uname`.

use std::path::PathBuf;

use anyhow::Context;

use crate::cache::{self, AddRepoFile, InputHash};
use crate::cpio::{archive, Entry};
use crate::{nolibc, sh};

const RECIPE_VERSION: &str = "initramfs-recipe-1";
const BUSYBOX: &str = "/bin/busybox";

/// The marker the test init prints first; tests and the bench look for it.
pub const INIT_MARKER: &str = "MICROAGENT-INIT-OK";

/// Builds (or finds) the initramfs; returns its path.
pub fn build() -> anyhow::Result<PathBuf> {
    sh::ensure_debs(&["busybox-static"])?;
    let init_c = cache::repo_root().join("guest/initramfs/init.c");
    let mut hash = InputHash::default();
    hash.add("recipe", RECIPE_VERSION.as_bytes());
    hash.add_file(&init_c)?;
    for pkg in ["busybox-static", "linux-source-6.1"] {
        hash.add(pkg, sh::deb_version(pkg).unwrap_or_default().as_bytes());
    }
    let cpio = cache::cached_file(
        "initramfs",
        &hash.short(),
        "initramfs.cpio",
        |work, partial| {
            eprintln!("xtask: building the test initramfs");
            let init_bytes = nolibc::build(work, &[&init_c])?.remove(0);
            let busybox = std::fs::read(BUSYBOX)
                .with_context(|| format!("reading {BUSYBOX} (package busybox-static)"))?;
            let bytes = archive(&[
                Entry::Dir {
                    path: "dev",
                    mode: 0o755,
                },
                Entry::CharDev {
                    path: "dev/console",
                    mode: 0o600,
                    major: 5,
                    minor: 1,
                },
                Entry::Dir {
                    path: "bin",
                    mode: 0o755,
                },
                Entry::File {
                    path: "bin/busybox",
                    mode: 0o755,
                    data: &busybox,
                },
                Entry::Symlink {
                    path: "bin/uname",
                    target: "busybox",
                },
                Entry::Dir {
                    path: "proc",
                    mode: 0o755,
                },
                Entry::Dir {
                    path: "sys",
                    mode: 0o755,
                },
                Entry::File {
                    path: "init",
                    mode: 0o755,
                    data: &init_bytes,
                },
            ]);
            std::fs::write(partial, &bytes)?;
            Ok(())
        },
    )?;
    let link = cache::link_current("initramfs.cpio", &cpio)?;
    eprintln!("xtask: test initramfs: {}", link.display());
    println!("{}", cpio.display());
    Ok(cpio)
}
