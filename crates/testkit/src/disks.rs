//! Disks that fail on purpose, for the fault-injection tests: a small
//! tmpfs that fills up (ENOSPC), and an ext4 filesystem whose block device
//! answers writes with EIO while a trigger file exists (nbdkit's error
//! filter behind nbdfuse and a loop device: the device-mapper error target
//! where the kernel has no device-mapper). Both need root; without it, or
//! without the tools, the test is recorded as skipped with the reason.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn root(test: &str, what: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        crate::skip(test, &format!("{what} needs root"));
        return false;
    }
    true
}

fn mount(args: &[&str], target: &Path) {
    let status = Command::new("mount").args(args).arg(target).status();
    assert!(
        status.as_ref().is_ok_and(|s| s.success()),
        "mount {args:?} {}: {status:?}",
        target.display()
    );
}

fn unmount(target: &Path) {
    let _ = Command::new("umount").arg(target).status();
}

/// A tmpfs of `size` (as `mount -o size=` takes it) mounted on `dir`,
/// private to its owner, unmounted when dropped.
#[derive(Debug)]
pub struct SmallDisk(PathBuf);

impl SmallDisk {
    /// Mounts it, or records `test` as skipped (not root) and gives None.
    pub fn mount(test: &str, dir: &Path, size: &str) -> Option<SmallDisk> {
        if !root(test, "mounting a small tmpfs") {
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        mount(
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ],
            dir,
        );
        Some(SmallDisk(dir.to_owned()))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        unmount(&self.0);
    }
}

/// An ext4 filesystem of 64 MiB mounted on a directory, empty and private,
/// whose device fails every request with EIO while [`FailingDisk::fail`]
/// is on. Writes land in the page cache first, as on a real failing disk,
/// so the error surfaces where the writer flushes (fsync, syncfs). What
/// serves it lives beside the mount point, in `<mount point>.nbd/`.
#[derive(Debug)]
pub struct FailingDisk {
    at: PathBuf,
    parts: PathBuf,
    nbdfuse: Child,
}

impl FailingDisk {
    /// Mounts it on `at` (made if missing), or records `test` as skipped
    /// (not root, or nbdkit or nbdfuse missing: `apt-get install nbdkit
    /// libnbd-bin`) and gives None.
    pub fn mount(test: &str, at: &Path) -> Option<FailingDisk> {
        if !root(test, "a loop-mounted failing disk") {
            return None;
        }
        for tool in ["nbdkit", "nbdfuse"] {
            if workspace::host::settings::host_tool(tool).is_none() {
                crate::skip(
                    test,
                    &format!("{tool} is not installed (apt-get install nbdkit libnbd-bin)"),
                );
                return None;
            }
        }
        let mkfs = crate::require(test, crate::host_tool("mkfs.ext4"))?;
        let parts = at.with_extension("nbd");
        let _ = std::fs::remove_dir_all(&parts);
        std::fs::create_dir_all(parts.join("fuse")).unwrap();
        std::fs::create_dir_all(at).unwrap();
        let pidfile = parts.join("nbdfuse.pid");
        let image = parts.join("fuse/disk");
        let nbdfuse = Command::new("nbdfuse")
            .arg("-P")
            .arg(&pidfile)
            .arg(&image)
            .args([
                "--command",
                "nbdkit",
                "-s",
                "--filter=error",
                "memory",
                "64M",
            ])
            .args(["error-rate=100%", "error=EIO"])
            .arg(format!("error-file={}", parts.join("trigger").display()))
            // It reports each injected error; the test reports what matters.
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nbdfuse");
        let disk = FailingDisk {
            at: at.to_owned(),
            parts,
            nbdfuse,
        };
        // nbdfuse writes its pid file once the file is served.
        assert!(
            crate::wait_until(Duration::from_secs(20), || pidfile.exists()),
            "nbdfuse did not serve {}",
            image.display()
        );
        let made = Command::new(mkfs)
            .args(["-q", "-F"])
            .arg(&image)
            .status()
            .unwrap();
        assert!(made.success(), "mkfs.ext4 on the nbdfuse file");
        // errors=continue: the filesystem stays mounted after an I/O
        // error, so the test can look at what is left.
        mount(&["-o", "loop,errors=continue", image.to_str().unwrap()], at);
        let _ = std::fs::remove_dir(at.join("lost+found"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o700)).unwrap();
        Some(disk)
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.at
    }

    /// While on, every read and write of the device fails with EIO. What
    /// was written before it is turned on is flushed to the device first.
    pub fn fail(&mut self, on: bool) {
        let trigger = self.parts.join("trigger");
        if on {
            let synced = Command::new("sync").arg("-f").arg(&self.at).status();
            assert!(
                synced.is_ok_and(|s| s.success()),
                "sync -f {}",
                self.at.display()
            );
            std::fs::write(&trigger, "").unwrap();
        } else {
            let _ = std::fs::remove_file(&trigger);
        }
    }
}

impl Drop for FailingDisk {
    fn drop(&mut self) {
        self.fail(false);
        unmount(&self.at);
        unmount(&self.parts.join("fuse"));
        let _ = self.nbdfuse.kill();
        let _ = self.nbdfuse.wait();
        let _ = std::fs::remove_dir_all(&self.parts);
    }
}
