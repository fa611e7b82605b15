//! What the workspace crate's own tests share (its unit tests include this
//! file too): a fake image that passes the import checks, and the skip when
//! mkfs.ext4 is missing. testkit has the same for other crates' tests; this
//! crate cannot use testkit, which depends on it.

// Each test binary that includes this file uses part of it.
#![allow(dead_code)]

use std::path::Path;

/// Writes `vmlinux` and `rootfs.ext4` into `dir`: the right magic numbers
/// (ELF, ext4 superblock), not bootable.
pub fn fake_image_files(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let mut kernel = vec![0u8; 4096];
    kernel[..4].copy_from_slice(b"\x7fELF");
    std::fs::write(dir.join("vmlinux"), kernel).unwrap();
    let mut rootfs = vec![0u8; 8192];
    rootfs[1080..1082].copy_from_slice(&[0x53, 0xef]);
    std::fs::write(dir.join("rootfs.ext4"), rootfs).unwrap();
}

/// Passes `here` (whether mkfs.ext4 was found) through; when false,
/// records `test` as skipped the way testkit does (a line in
/// `$MICROAGENT_SKIP_LOG`).
pub fn have_mkfs(test: &str, here: bool) -> bool {
    if !here {
        skip(
            test,
            "mkfs.ext4 is not installed (apt-get install e2fsprogs)",
        );
    }
    here
}

/// Records `test` as skipped for `reason` the way testkit does (a line in
/// `$MICROAGENT_SKIP_LOG`), and says so on stderr.
pub fn skip(test: &str, reason: &str) {
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(log) = std::env::var_os("MICROAGENT_SKIP_LOG") {
        use std::io::Write;
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(Path::new(&log))
            .and_then(|mut f| writeln!(f, "{test}: {reason}"));
    }
}
