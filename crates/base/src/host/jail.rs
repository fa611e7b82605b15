//! A private view of the filesystem for a VMM process, with Firecracker's
//! jailer as the model: in a mount namespace of its own, the process's root
//! becomes a small read-only tmpfs holding only what it still opens once
//! its machine is built: its workspace directory, its lock file, the
//! snapshots directory, the warm-snapshot directory it may fill, and its
//! own `/proc` entry. Its disks, kernel, `/dev/kvm`, network and cgroup
//! files are open by then. A bug in the code that parses guest requests
//! finds no other host path to open.
//!
//! Two steps: [`unshare`] while the process has one thread (a namespace
//! taken later would cover only the thread that took it) and after the
//! network helper started (a process in the namespace would be moved by
//! the pivot, whatever root it was setting up for itself), and [`enter`]
//! once the machine is built, which moves every thread's root. Both need
//! `CAP_SYS_ADMIN`, or a user namespace of the process's own where the
//! host allows unprivileged ones; without either the VMM runs unjailed and
//! `inspect` says so.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The directory in the workspace the private root is mounted on (empty
/// on the host: the mount exists only in the VMM's namespace).
pub const JAIL_DIR: &str = "vmm-root";

/// Why the filesystem could not be made private.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// The process had threads already.
    #[error("the process already runs {0} threads; a mount namespace must come first")]
    Threaded(usize),
    /// A process started from this one did not take a mount namespace of
    /// its own in time (see [`wait_until_apart`]).
    #[error("process {0} still shares the mount namespace")]
    StillShared(u32),
    /// The private root made ahead is no longer at its directory.
    #[error("the private root made at {} is no longer there", .0.display())]
    RootReplaced(PathBuf),
    /// A system call failed.
    #[error("{step}")]
    Call {
        /// What was being done.
        step: String,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

fn call(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> JailError {
    let step = step.into();
    move |source| JailError::Call { step, source }
}

fn check(rc: libc::c_int, step: impl Into<String>) -> Result<(), JailError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(call(step)(std::io::Error::last_os_error()))
    }
}

fn c_path(path: &Path) -> Result<CString, JailError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| JailError::Call {
        step: format!("{} has a NUL byte", path.display()),
        source: std::io::ErrorKind::InvalidInput.into(),
    })
}

/// mount(2) with C strings, or nulls for `None`.
fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
    step: impl Into<String>,
) -> Result<(), JailError> {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is a valid C string or null, as mount(2) takes
    // them; the kernel does not keep them.
    let rc = unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
    };
    check(rc, step)
}

/// Takes a mount namespace of its own whose mounts do not propagate to the
/// host's: directly with `CAP_SYS_ADMIN`, else inside a user namespace of
/// its own where the host allows unprivileged ones (this user's uid and
/// gid mapped to themselves, so files keep their owners and `/dev/kvm`
/// its permission). Call while the process has one thread.
pub fn unshare() -> Result<(), JailError> {
    let n = crate::host::settings::threads_of_this_process();
    if n != 1 {
        return Err(JailError::Threaded(n));
    }
    if crate::host::settings::has_capability(crate::host::settings::CAP_SYS_ADMIN) {
        // SAFETY: unshare takes flags only.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNS) };
        check(rc, "taking a mount namespace")?;
    } else {
        // SAFETY: getuid and getgid take nothing.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        // SAFETY: unshare takes flags only.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) };
        check(
            rc,
            "taking a user and mount namespace (without CAP_SYS_ADMIN this needs unprivileged user namespaces)",
        )?;
        let write = |file: &str, text: String| {
            std::fs::write(format!("/proc/self/{file}"), text)
                .map_err(call(format!("writing /proc/self/{file}")))
        };
        // The kernel requires setgroups denied before an unprivileged
        // gid_map; the groups this process has (kvm) stay.
        write("setgroups", "deny".into())?;
        write("uid_map", format!("{uid} {uid} 1"))?;
        write("gid_map", format!("{gid} {gid} 1"))?;
    }
    make_private()
}

/// Why VMMs of this user get no private root, and how to change that.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoPrivateRoot {
    /// What blocks it.
    pub why: String,
    /// The host setting that lifts it.
    pub enable: &'static str,
}

/// How a VMM started by this user gets its private root (for `doctor`),
/// or why it cannot.
pub fn availability() -> Result<&'static str, NoPrivateRoot> {
    if crate::host::settings::has_capability(crate::host::settings::CAP_SYS_ADMIN) {
        return Ok("a mount namespace (CAP_SYS_ADMIN)");
    }
    if let Some(blocked) = user_namespaces_blocked() {
        return Err(blocked);
    }
    Ok("a user and mount namespace of its own")
}

/// Why this host refuses unprivileged user namespaces, if it does.
fn user_namespaces_blocked() -> Option<NoPrivateRoot> {
    let sysctl = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/{name}"))
            .ok()
            .map(|v| v.trim().to_owned())
    };
    let blocked = |why: &str, enable| {
        Some(NoPrivateRoot {
            why: why.to_owned(),
            enable,
        })
    };
    if sysctl("kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return blocked(
            "unprivileged user namespaces are off (kernel.unprivileged_userns_clone = 0)",
            "sysctl -w kernel.unprivileged_userns_clone=1",
        );
    }
    if sysctl("user/max_user_namespaces").as_deref() == Some("0") {
        return blocked(
            "user namespaces are off (user.max_user_namespaces = 0)",
            "sysctl -w user.max_user_namespaces=15000",
        );
    }
    if sysctl("kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        return blocked(
            "AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1)",
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile that allows userns for microagent-vmm",
        );
    }
    None
}

/// Stops mounts propagating between this namespace and the host's.
fn make_private() -> Result<(), JailError> {
    mount(
        None,
        c"/",
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
        "making the mounts private",
    )
}

/// What the private root keeps, at the same absolute paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
    /// A directory (made first when missing), read-write.
    Dir(PathBuf),
    /// A file that exists, read-write.
    File(PathBuf),
}

impl Keep {
    fn path(&self) -> &Path {
        match self {
            Keep::Dir(p) | Keep::File(p) => p,
        }
    }
}

/// Makes a tmpfs on `jail` the root of this process (all its threads),
/// holding `keep` bind-mounted at their own paths and this process's
/// `/proc` entry, then makes that root read-only. After [`unshare`].
pub fn enter(jail: &Path, keep: &[Keep]) -> Result<(), JailError> {
    RootAhead::make(jail, &[])?.enter(keep)
}

/// A private root made but not yet entered: the tmpfs, this process's
/// `/proc` entry and what was kept so far. A standby VMM makes one while
/// it waits (after [`unshare`]), with the parts every workspace keeps,
/// and enters it at its claim with its workspace's own.
#[derive(Debug)]
pub struct RootAhead {
    jail: PathBuf,
    kept: Vec<Keep>,
    /// The tmpfs's device: the directory found at `jail` when it is
    /// entered must still be it (a directory removed on the host detaches
    /// the mount; one made again there is the host's disk).
    device: u64,
}

impl RootAhead {
    /// Mounts the tmpfs on `jail` (made when missing) and binds `keep`
    /// and this process's `/proc` entry into it.
    pub fn make(jail: &Path, keep: &[Keep]) -> Result<Self, JailError> {
        std::fs::create_dir_all(jail).map_err(call(format!("creating {}", jail.display())))?;
        let jail_c = c_path(jail)?;
        mount(
            Some(c"tmpfs"),
            &jail_c,
            Some(c"tmpfs"),
            NO_DEVICES,
            Some(c"size=1m,mode=0755"),
            format!("mounting a tmpfs on {}", jail.display()),
        )?;
        // The host's /proc names this process by its host pid, also from a
        // PID namespace of its own.
        let pid = crate::host::settings::own_pid();
        let own_proc = Keep::Dir(PathBuf::from(format!("/proc/{pid}")));
        for item in keep.iter().chain([&own_proc]) {
            bind(jail, item)?;
        }
        std::os::unix::fs::symlink(pid.to_string(), jail.join("proc/self"))
            .map_err(call("linking /proc/self"))?;
        std::fs::create_dir(jail.join(".old"))
            .map_err(call("creating the old root's mount point"))?;
        Ok(Self {
            jail: jail.to_path_buf(),
            kept: keep.to_vec(),
            device: device_of(jail)?,
        })
    }

    /// Unmounts it and removes its directory, for a process that will not
    /// enter it (a standby unclaimed).
    pub fn remove(self) {
        if let Ok(jail) = c_path(&self.jail) {
            // SAFETY: a valid C string and flags.
            unsafe { libc::umount2(jail.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_dir(&self.jail);
    }

    /// Binds what of `keep` it does not hold yet, makes it the root of
    /// this process (all its threads) and makes that root read-only.
    pub fn enter(self, keep: &[Keep]) -> Result<(), JailError> {
        let jail = &self.jail;
        if device_of(jail)? != self.device {
            return Err(JailError::RootReplaced(jail.clone()));
        }
        for item in keep.iter().filter(|k| !self.kept.contains(k)) {
            bind(jail, item)?;
        }
        let jail_c = c_path(jail)?;
        let old_c = c_path(&jail.join(".old"))?;
        // SAFETY: pivot_root takes two valid C strings.
        let rc = unsafe { libc::syscall(libc::SYS_pivot_root, jail_c.as_ptr(), old_c.as_ptr()) };
        check(if rc == 0 { 0 } else { -1 }, "pivot_root")?;
        std::env::set_current_dir("/").map_err(call("chdir /"))?;
        // SAFETY: a valid C string and flags.
        let rc = unsafe { libc::umount2(c"/.old".as_ptr(), libc::MNT_DETACH) };
        check(rc, "unmounting the old root")?;
        std::fs::remove_dir("/.old").map_err(call("removing the old root's mount point"))?;
        mount(
            None,
            c"/",
            None,
            libc::MS_REMOUNT | libc::MS_RDONLY | NO_DEVICES,
            None,
            "making the new root read-only",
        )
    }
}

/// The device of the directory at `path` (not followed if a link).
fn device_of(path: &Path) -> Result<u64, JailError> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .map(|m| m.dev())
        .map_err(call(format!("reading {}", path.display())))
}

/// The private root's mount flags: no set-id programs, device nodes or
/// programs run from it.
const NO_DEVICES: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;

/// Waits (at most `within`) until process `pid`, started from this one,
/// is in a mount namespace of its own: a [`RootAhead`] entered while a
/// process still shares this namespace would move that process's root
/// too. passt takes its own namespace as it starts.
pub fn wait_until_apart(pid: u32, within: std::time::Duration) -> Result<(), JailError> {
    use std::os::unix::fs::MetadataExt;
    let namespace = |of: &str| {
        std::fs::metadata(format!("/proc/{of}/ns/mnt"))
            .map(|m| (m.dev(), m.ino()))
            .map_err(call(format!("reading the mount namespace of {of}")))
    };
    let own = namespace("self")?;
    let until = std::time::Instant::now() + within;
    loop {
        if namespace(&pid.to_string())? != own {
            return Ok(());
        }
        if std::time::Instant::now() >= until {
            return Err(JailError::StillShared(pid));
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// Bind-mounts `item` at its own path under `jail`.
fn bind(jail: &Path, item: &Keep) -> Result<(), JailError> {
    let source = item.path();
    let target = jail.join(source.strip_prefix("/").unwrap_or(source));
    let made = match item {
        Keep::Dir(dir) => {
            std::fs::create_dir_all(dir).map_err(call(format!("creating {}", dir.display())))?;
            std::fs::create_dir_all(&target)
        }
        Keep::File(_) => target
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::File::create(&target).map(drop)),
    };
    made.map_err(call(format!(
        "making the mount point of {}",
        source.display()
    )))?;
    mount(
        Some(&c_path(source)?),
        &c_path(&target)?,
        None,
        libc::MS_BIND,
        None,
        format!("binding {}", source.display()),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_threaded_process_is_not_unshared() {
        // The test harness runs tests on threads of their own.
        let other =
            std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        let err = unshare().unwrap_err();
        assert!(matches!(err, JailError::Threaded(n) if n > 1), "{err}");
        other.join().unwrap();
    }

    /// Run by the two tests below in a child process: as root with a
    /// mount namespace of this thread's own; as another user, in a forked
    /// process of one thread, the VMM's way (a user namespace).
    #[test]
    #[ignore = "run in a child process by the tests below"]
    fn jailed_child() {
        let Some(kept) = std::env::var_os("MICROAGENT_JAIL_CHILD") else {
            return;
        };
        let kept = PathBuf::from(kept);
        // SAFETY: geteuid takes nothing.
        if unsafe { libc::geteuid() } == 0 {
            // The harness has threads, so `unshare()` would refuse; the
            // checks run on this thread, whose namespace this is.
            // SAFETY: unshare takes flags only.
            let rc = unsafe { libc::unshare(libc::CLONE_NEWNS) };
            let jailed = check(rc, "unshare")
                .and_then(|()| make_private())
                .and_then(|()| enter_and_check(&kept));
            if let Err(e) = jailed {
                panic!("{}", crate::error_chain::error_chain(&e));
            }
            return;
        }
        // SAFETY: the child runs only this thread's code; glibc keeps
        // malloc usable after fork, and the child ends with _exit.
        match unsafe { libc::fork() } {
            0 => {
                let code = match unshare().and_then(|()| enter_and_check(&kept)) {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("{}", crate::error_chain::error_chain(&e));
                        3
                    }
                };
                // SAFETY: ends the forked child without running the
                // parent's exit handlers.
                unsafe { libc::_exit(code) }
            }
            pid => {
                let mut status = 0;
                // SAFETY: waits for our own child; `status` is ours.
                assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "the jailed child failed ({status:#x})"
                );
            }
        }
    }

    fn enter_and_check(kept: &Path) -> Result<(), JailError> {
        // Made ahead with the kept directory, as a standby makes it with
        // the snapshots directory, then entered with it named again.
        let keep = [Keep::Dir(kept.to_path_buf())];
        RootAhead::make(&kept.join(JAIL_DIR), &keep)?.enter(&keep)?;
        // This thread's namespace (the harness's other threads keep theirs).
        // SAFETY: gettid takes nothing and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) };
        let mounts = std::fs::read_to_string(format!("/proc/self/task/{tid}/mountinfo"))
            .map_err(call("mountinfo"))?;
        let binds = mounts
            .lines()
            .filter(|l| l.split(' ').nth(4) == kept.to_str())
            .count();
        let seen = |p: &str| Path::new(p).exists();
        let io = |what: &str| JailError::Call {
            step: what.to_owned(),
            source: std::io::ErrorKind::Other.into(),
        };
        if seen("/etc/passwd") || seen("/dev/kvm") || seen("/usr") {
            return Err(io("the host's files are still visible"));
        }
        if binds != 1 {
            return Err(io(&format!("what was kept ahead is bound {binds} times")));
        }
        std::fs::write(kept.join("written"), b"ok").map_err(call("writing in the kept dir"))?;
        if std::fs::write("/outside", b"x").is_ok() {
            return Err(io("the root is writable"));
        }
        let status = std::fs::read_to_string("/proc/self/status").map_err(call("/proc/self"))?;
        if !status.contains("Pid:") {
            return Err(io("/proc/self is not this process"));
        }
        Ok(())
    }

    /// Prints and logs a skipped test (`MICROAGENT_SKIP_LOG`) with why.
    pub(crate) fn skip(why: &str) {
        eprintln!("SKIPPED {why}");
        if let Some(log) = std::env::var_os("MICROAGENT_SKIP_LOG") {
            use std::io::Write;
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .and_then(|mut f| writeln!(f, "{why}"));
        }
    }

    /// A directory for a test's child that runs as another user: made
    /// under a parent every user can traverse (the temp dir, else `/tmp`),
    /// owned by that user, removed when dropped. The child's program is
    /// copied into it, so the test does not depend on where the checkout
    /// lives (a clone in a 0700 directory is not enterable by `nobody`).
    struct OtherUserDir(PathBuf);

    impl OtherUserDir {
        fn new(uid: Option<u32>) -> Result<Self, String> {
            let parent = [std::env::temp_dir(), PathBuf::from("/tmp")]
                .into_iter()
                .find(|p| uid.is_none() || traversable_by_all(p))
                .ok_or("neither the temp dir nor /tmp is traversable by every user")?;
            let dir = parent.join(format!("ma-jail-{}", crate::host::settings::unique_id()));
            std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let made = Self(dir);
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            std::fs::copy(&exe, made.program()).map_err(|e| format!("{}: {e}", exe.display()))?;
            std::fs::create_dir(made.kept()).map_err(|e| e.to_string())?;
            if let Some(uid) = uid {
                for path in [made.0.as_path(), &made.kept(), &made.program()] {
                    std::os::unix::fs::chown(path, Some(uid), Some(uid))
                        .map_err(|e| format!("chown {}: {e}", path.display()))?;
                }
            }
            Ok(made)
        }

        fn program(&self) -> PathBuf {
            self.0.join("test-binary")
        }

        fn kept(&self) -> PathBuf {
            self.0.join("kept")
        }
    }

    impl Drop for OtherUserDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// True when every user may pass through `path` and its ancestors.
    fn traversable_by_all(path: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt;
        path.ancestors().all(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o001 != 0)
        })
    }

    /// Runs [`jailed_child`] as `uid` (this process's own when `None`)
    /// over a fresh kept directory; checks what it wrote and left.
    fn run_jailed_child(test: &str, uid: Option<u32>) {
        use std::os::unix::process::CommandExt;
        let dir = match OtherUserDir::new(uid) {
            Ok(dir) => dir,
            Err(why) => return skip(&format!("{test}: {why}")),
        };
        let kept = dir.kept();
        // The test's name as libtest knows it (this module's path without
        // the crate's name), so a move of the module keeps it found.
        let module = module_path!().split_once("::").map_or("", |(_, m)| m);
        let child_test = format!("{module}::jailed_child");
        let mut cmd = std::process::Command::new(dir.program());
        cmd.args(["--ignored", "--exact", &child_test, "--nocapture"])
            .current_dir(&dir.0)
            .env("MICROAGENT_JAIL_CHILD", &kept);
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        assert_eq!(std::fs::read(kept.join("written")).unwrap(), b"ok");
        // On the host the mount point is an empty directory.
        assert_eq!(std::fs::read_dir(kept.join(JAIL_DIR)).unwrap().count(), 0);
    }

    #[test]
    fn a_jailed_child_sees_only_what_it_keeps() {
        // SAFETY: geteuid takes nothing.
        if unsafe { libc::geteuid() } != 0 {
            return skip("a_jailed_child_sees_only_what_it_keeps: needs root (CAP_SYS_ADMIN)");
        }
        run_jailed_child("a_jailed_child_sees_only_what_it_keeps", None);
    }

    #[test]
    fn without_root_the_jail_comes_through_a_user_namespace() {
        let test = "without_root_the_jail_comes_through_a_user_namespace";
        // SAFETY: geteuid takes nothing.
        if unsafe { libc::geteuid() } != 0 {
            return skip(&format!("{test}: needs root to run its child as nobody"));
        }
        if let Some(blocked) = user_namespaces_blocked() {
            return skip(&format!("{test}: {}", blocked.why));
        }
        const NOBODY: u32 = 65534;
        run_jailed_child(test, Some(NOBODY));
    }

    #[test]
    fn a_child_in_this_namespace_is_waited_for_and_one_apart_is_not() {
        let test =
            "host::jail::tests::a_child_in_this_namespace_is_waited_for_and_one_apart_is_not";
        let mut shared = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let began = std::time::Instant::now();
        let err = wait_until_apart(shared.id(), std::time::Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, JailError::StillShared(_)), "{err}");
        assert!(began.elapsed() >= std::time::Duration::from_millis(50));
        let _ = shared.kill();
        let _ = shared.wait();
        if !crate::host::settings::has_capability(crate::host::settings::CAP_SYS_ADMIN) {
            skip(&format!(
                "{test}: the namespace apart needs CAP_SYS_ADMIN (run as root)"
            ));
            return;
        }
        let mut apart = std::process::Command::new("unshare")
            .args(["--mount", "sleep", "5"])
            .spawn()
            .unwrap();
        let waited = wait_until_apart(apart.id(), std::time::Duration::from_secs(5));
        let _ = apart.kill();
        let _ = apart.wait();
        waited.unwrap();
    }

    #[test]
    fn a_root_made_ahead_whose_directory_was_replaced_is_not_entered() {
        // No mount needed: a directory's device is what is compared.
        let dir =
            std::env::temp_dir().join(format!("ma-root-{}", crate::host::settings::unique_id()));
        std::fs::create_dir(&dir).unwrap();
        let made = RootAhead {
            jail: dir.clone(),
            kept: Vec::new(),
            device: device_of(&dir).unwrap() ^ 1,
        };
        let err = made.enter(&[]).unwrap_err();
        assert!(matches!(err, JailError::RootReplaced(_)), "{err}");
        std::fs::remove_dir(&dir).unwrap();
    }
}
