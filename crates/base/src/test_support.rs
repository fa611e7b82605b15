//! What tests of this crate and of the others share (testkit re-exports
//! it): a fake image that passes the import checks, a workspace recorded as
//! running with the test process as its VMM, peak memory, and skip
//! accounting. Compiled for this crate's unit tests and with the
//! `test-support` feature, which only testkit enables.

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
/// records `test` as skipped.
pub fn have_mkfs(test: &str, here: bool) -> bool {
    if !here {
        skip(
            test,
            "mkfs.ext4 is not installed (apt-get install e2fsprogs)",
        );
    }
    here
}

/// Records that `test` was skipped and why: on stderr, and as a line in
/// the file `$MICROAGENT_SKIP_LOG` names (`cargo xtask test` counts those
/// as skipped, not passed).
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(path) = std::env::var_os("MICROAGENT_SKIP_LOG") {
        let line = format!("{test}: {reason}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!(
                "could not record the skip in {}: {e}",
                Path::new(&path).display()
            );
        }
    }
}

/// Records the workspace in `dir` as running with this process as its VMM
/// (for tests that serve its vsock socket with `guest_agent::fake`; never
/// `delete` or `stop` it: that would signal this process).
pub fn pretend_running(dir: &Path) {
    let path = dir.join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Field 22 (start time), counted after the command's closing paren.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let start: u64 = after.split(' ').nth(19).unwrap().parse().unwrap();
    meta["state"] = "running".into();
    meta["runtime"] = serde_json::json!({
        "pid": std::process::id(),
        "pid_start": start,
        "started_at_ms": 1,
    });
    std::fs::write(&path, serde_json::to_vec(&meta).unwrap()).unwrap();
}

/// Entries of `dir` but hidden ones (a lock, a call under way).
pub fn visible_entries(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            !e.as_ref()
                .unwrap()
                .file_name()
                .as_encoded_bytes()
                .starts_with(b".")
        })
        .count()
}

/// The most this process has had resident, in KiB (`VmHWM`).
pub fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}
