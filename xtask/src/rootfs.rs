//! `cargo xtask test-rootfs`: a small ext4 root filesystem for the device
//! tests, made with `mkfs.ext4 -d` (no root, no loop mounts). Its /init is
//! the device test program (guest/devtest/devtest.c). Also the static guest
//! programs the end-to-end tests copy into a guest (guest/ymmcheck).

use std::path::PathBuf;
use std::process::Command;

use crate::cache::{self, AddRepoFile, InputHash};
use crate::{nolibc, sh};

const RECIPE_VERSION: &str = "test-rootfs-recipe-1";
/// Image size: the program is ~10 KB, ext4 needs some room for metadata.
const SIZE: &str = "8M";

/// Builds (or finds) the image; returns its path.
pub fn build() -> anyhow::Result<PathBuf> {
    sh::ensure_debs(&["e2fsprogs"])?;
    let source = cache::repo_root().join("guest/devtest/devtest.c");
    let mut hash = InputHash::default();
    hash.add("recipe", RECIPE_VERSION.as_bytes());
    hash.add_file(&source)?;
    for pkg in ["linux-source-6.1", "e2fsprogs"] {
        hash.add(pkg, sh::deb_version(pkg).unwrap_or_default().as_bytes());
    }
    let image = cache::cached_file(
        "test-rootfs",
        &hash.short(),
        "rootfs.ext4",
        |work, partial| {
            eprintln!("xtask: building the device test root filesystem");
            let tree = work.join("tree");
            for dir in ["dev", "mnt", "proc", "sys", "tmp"] {
                std::fs::create_dir_all(tree.join(dir))?;
            }
            let init = nolibc::build(work, &[&source])?.remove(0);
            std::fs::write(tree.join("init"), init)?;
            sh::run(Command::new("chmod").arg("0755").arg(tree.join("init")))?;
            sh::run(
                Command::new("mkfs.ext4")
                    .args([
                        "-q",
                        "-F",
                        "-L",
                        "microagent-test",
                        "-E",
                        "root_owner=0:0",
                        "-d",
                    ])
                    .arg(&tree)
                    .arg(partial)
                    .arg(SIZE),
            )
        },
    )?;
    let link = cache::link_current("test-rootfs.ext4", &image)?;
    eprintln!("xtask: device test root filesystem: {}", link.display());
    guest_program("ymmcheck")?;
    println!("{}", image.display());
    Ok(image)
}

/// A static nolibc guest program, `guest/NAME/NAME.c`, built into the cache
/// and linked as `current/NAME` (the YMM switch check of docs/host-compat.md,
/// the guest side of `cargo xtask bench net`).
pub fn guest_program(name: &str) -> anyhow::Result<PathBuf> {
    let source = cache::repo_root().join(format!("guest/{name}/{name}.c"));
    let mut hash = InputHash::default();
    hash.add_file(&source)?;
    hash.add(
        "linux-source-6.1",
        sh::deb_version("linux-source-6.1")
            .unwrap_or_default()
            .as_bytes(),
    );
    let program = cache::cached_file(name, &hash.short(), name, |work, partial| {
        let bytes = nolibc::build(work, &[&source])?.remove(0);
        std::fs::write(partial, bytes)?;
        std::fs::set_permissions(partial, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        Ok(())
    })?;
    let link = cache::link_current(name, &program)?;
    eprintln!("xtask: guest program {name}: {}", link.display());
    Ok(program)
}
