//! What guards a VMM process besides its guest's own end: the seccomp
//! confinement it runs under, and the owner process a one-shot workspace
//! lives for (docs/security.md).

use std::os::fd::{AsRawFd, OwnedFd};

use std::path::Path;

use base::store::workspace_dir::WorkspaceDir;
use base::store::StateDir;

use base::vmm::confinement::NO_SECCOMP_VAR;

/// Installs the VMM's seccomp filters on every thread (vCPU and device
/// threads add their own as they start); returns the protections now on.
/// `children` are the processes it started (passt), the only ones besides
/// itself it may signal; `ahead`, filters a standby compiled while it
/// waited, serve when they were made for those children.
pub fn confine(
    children: &[u32],
    ahead: Option<vmm_core::seccomp::Filters>,
) -> Result<Vec<String>, vmm_core::seccomp::SeccompError> {
    if std::env::var_os(NO_SECCOMP_VAR).is_some_and(|v| v == "1") {
        tracing::warn!("{NO_SECCOMP_VAR}=1: the VMM runs without seccomp filters");
        return Ok(Vec::new());
    }
    let began = std::time::Instant::now();
    let ahead = ahead.filter(|f| f.made_for(children));
    let made_ahead = ahead.is_some();
    let filters = match ahead {
        Some(filters) => filters,
        None => vmm_core::seccomp::Filters::with_children(&crate::seccomp::CONTROL, children)?,
    };
    let compiled = began.elapsed();
    vmm_core::seccomp::confine_process(filters)?;
    tracing::info!(
        seccomp_made_ahead = made_ahead,
        seccomp_compiled_us = compiled.as_micros() as u64,
        seccomp_installed_us = began.elapsed().as_micros() as u64,
        "seccomp filters (times since their making began)"
    );
    Ok(vec!["seccomp".into(), "no_new_privs".into()])
}

/// Everything that confines a VMM process once its machine is built.
#[derive(Debug)]
pub struct Lockdown {
    /// Its disk and memory sizes in MiB (the largest files it writes).
    pub disk_and_mem_mib: (u64, u64),
    /// Its own mount namespace (with the private root made in it ahead,
    /// when a standby made one), or why it has none.
    pub mount_ns: Result<Option<base::host::jail::RootAhead>, String>,
    /// Its own empty network namespace, or why it has none.
    pub net_ns: Result<(), String>,
    /// What its private root keeps.
    pub keep: Vec<base::host::jail::Keep>,
    /// The processes it started (passt).
    pub children: Vec<u32>,
    /// Seccomp filters a standby compiled ahead (see [`confine`]).
    pub filters_ahead: Option<vmm_core::seccomp::Filters>,
    /// Directories it removes its cgroups from at the end (opened before).
    pub removable: Vec<std::os::fd::OwnedFd>,
    /// The account (uid, gid) to change to, when started as root.
    pub user: Option<(u32, u32)>,
}

impl Lockdown {
    /// In order: resource limits, the private root (when the namespace was
    /// taken), its own account and no capabilities, Landlock, the seccomp
    /// filters. Returns the protections on, or why the VMM must not run
    /// the guest.
    pub fn apply(self, ws: &WorkspaceDir) -> Result<Vec<String>, String> {
        let began = std::time::Instant::now();
        let since = || began.elapsed().as_micros() as u64;
        let (disk_mib, mem_mib) = self.disk_and_mem_mib;
        limit_resources(disk_mib, mem_mib)
            .map_err(|e| format!("the VMM could not limit its resources: {e}"))?;
        let private_root = self.mount_ns.is_ok();
        let mounts = match self.mount_ns {
            Ok(root_ahead) => {
                match root_ahead {
                    Some(root) => root.enter(&self.keep),
                    None => base::host::jail::enter(
                        &ws.path().join(base::host::jail::JAIL_DIR),
                        &self.keep,
                    ),
                }
                .map_err(|e| {
                    format!(
                        "the VMM could not make its root private: {}",
                        base::error_chain::error_chain(&e)
                    )
                })?;
                "private_root".to_owned()
            }
            Err(why) => format!("no private root: {why}"),
        };
        let private_root_us = since();
        // Only inside the private root: on the host's, the state directory
        // (root's, 0700) would be out of the account's reach.
        let user = self.user.filter(|_| private_root);
        if let Some((uid, gid)) = user {
            // Its own sockets, which it connects to itself (the agent link,
            // port tunnels): a socket is connected to with write permission.
            for socket in [ws.vsock(), ws.control()] {
                std::os::unix::fs::lchown(&socket, Some(uid), Some(gid)).map_err(|e| {
                    format!("the VMM could not hand over {}: {e}", socket.display())
                })?;
            }
        }
        // Last before the filters: the private root needed CAP_SYS_ADMIN.
        drop_capabilities(user)
            .map_err(|e| format!("the VMM could not drop its capabilities: {e}"))?;
        let account = match (user, self.user) {
            (Some((uid, gid)), _) => format!("uid:{uid}:{gid}"),
            (None, Some(_)) => "no own account: no private root".to_owned(),
            // SAFETY: geteuid has no preconditions.
            (None, None) if unsafe { libc::geteuid() } == 0 => {
                "no own account: runs as root (no vmm_user account)".to_owned()
            }
            // SAFETY: as above.
            (None, None) => format!("uid:{}", unsafe { libc::geteuid() }),
        };
        // Process 1 of its namespace: the starter made one.
        let pids = if std::process::id() == 1 {
            "pid_namespace".to_owned()
        } else {
            "no pid namespace: its starter is not root".to_owned()
        };
        let account_us = since();
        // A kernel without Landlock leaves the rest in force.
        let files = crate::file_access::confine(&self.keep, self.removable).unwrap_or_else(|e| {
            let why = base::error_chain::error_chain(&e);
            tracing::warn!("no Landlock: {why}");
            format!("no landlock: {why}")
        });
        let landlock_us = since();
        let mut protections = confine(&self.children, self.filters_ahead)
            .map_err(|e| format!("the VMM could not confine itself: {e}"))?;
        tracing::info!(
            private_root_us,
            account_us,
            landlock_us,
            seccomp_us = since(),
            "confinement's steps (times since it began)"
        );
        let network = match self.net_ns {
            Ok(()) => "network_namespace".to_owned(),
            Err(why) => format!("no network namespace: {why}"),
        };
        protections.extend([
            "rlimits".to_owned(),
            "inherited_fds_closed".to_owned(),
            "no_capabilities".to_owned(),
            mounts,
            network,
            files,
            account,
            pids,
        ]);
        Ok(protections)
    }
}

/// Moves the calling thread (the only one, when the VMM calls it) into an
/// empty network namespace of its own: no interface but a down loopback,
/// and no abstract Unix socket of the host's. Its network backend (passt's
/// socket pair, a TAP) and published ports' listeners are open already and
/// keep working. Needs CAP_SYS_ADMIN, as root or in the user namespace the
/// VMM took for its private root.
/// `ahead`, an empty namespace made by [`empty_network_ahead`], is
/// entered instead of making one.
pub fn leave_host_network(ahead: Option<OwnedFd>) -> Result<(), String> {
    if let Some(namespace) = ahead {
        // SAFETY: setns on a namespace descriptor this process owns.
        if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
            return Ok(());
        }
        tracing::info!(
            "entering the network namespace made ahead: {}; making one",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: unshare takes flags only.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}

/// Makes an empty network namespace for [`leave_host_network`] to enter
/// later: for a standby, which knows no workspace yet but has the time.
/// It is made on a thread of its own, which ends with it, so the calling
/// thread never leaves the host's namespace (coming back would need
/// CAP_SYS_ADMIN over the host's, which a process whose capability is its
/// own user namespace's does not have). `None` without CAP_SYS_ADMIN (the
/// VMM makes its own later, in the user namespace of its private root).
/// Returns once that thread is gone, so that a mount namespace taken next
/// finds the process single-threaded again.
pub fn empty_network_ahead() -> Result<Option<OwnedFd>, String> {
    if !base::host::settings::has_capability(base::host::settings::CAP_SYS_ADMIN) {
        return Ok(None);
    }
    let (made, tid) = std::thread::spawn(|| {
        // The raw call: the static VMM's C library has no gettid wrapper
        // (its symbol is null there).
        // SAFETY: gettid takes nothing and cannot fail.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) };
        // SAFETY: unshare takes flags only; it moves this thread alone.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return (
                Err(format!("unshare: {}", std::io::Error::last_os_error())),
                tid,
            );
        }
        let made = std::fs::File::open("/proc/thread-self/ns/net")
            .map(OwnedFd::from)
            .map_err(|e| format!("opening the new network namespace: {e}"));
        (made, tid)
    })
    .join()
    .map_err(|_| "the thread making it panicked".to_owned())?;
    let made = made?;
    // The thread is joined before the kernel has quite let it go.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    while std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() {
        if std::time::Instant::now() > deadline {
            return Err("the thread that made it did not end".to_owned());
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    Ok(Some(made))
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two 32-bit halves.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// Above every capability a kernel has defined (40 in 6.x).
const CAPABILITIES_AT_MOST: libc::c_ulong = 64;

/// Gives up every capability of the calling thread for good: the ambient
/// and bounding sets (so nothing regains one), then, as `user` (uid, gid)
/// when given (no supplementary groups), the effective, permitted and
/// inheritable sets. The VMM calls it before it starts any
/// thread, so every thread inherits none. After this it writes only its
/// own files (it stays their owner) and binds no socket (its listeners are
/// bound before, or handed over). Without root (or CAP_SETPCAP in its user
/// namespace) the bounding set stays as it was: an unprivileged process
/// has nothing in it to use.
pub fn drop_capabilities(user: Option<(u32, u32)>) -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    for cap in 0..CAPABILITIES_AT_MOST {
        // SAFETY: as above. EINVAL past the last capability, EPERM without
        // CAP_SETPCAP: both leave the set as it is.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
    if let Some((uid, gid)) = user {
        // SAFETY: plain integers and a null list of no groups. The process
        // has one thread, so these (unlike the raw calls) cover it whole.
        let changed = unsafe {
            libc::setgroups(0, std::ptr::null()) == 0
                && libc::setresgid(gid, gid, gid) == 0
                && libc::setresuid(uid, uid, uid) == 0
        };
        if !changed {
            return Err(std::io::Error::last_os_error());
        }
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let none = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads a version 3 header and two data structs, which
    // live for the call; pid 0 is the calling thread.
    if unsafe { libc::syscall(libc::SYS_capset, &header, none.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What a VMM's private root keeps: its workspace directory and lock file,
/// the snapshots directory (a snapshot is written there), and the
/// directory of the warm snapshot it keeps, if any.
pub fn jail_keeps(
    state: &StateDir,
    ws: &WorkspaceDir,
    keep_warm: Option<&Path>,
) -> Vec<base::host::jail::Keep> {
    use base::host::jail::Keep;
    let mut keep = vec![
        Keep::Dir(ws.path().to_path_buf()),
        Keep::File(state.lock_path(ws.name())),
    ];
    keep.extend(state_keeps(state.root()));
    if let Some(parent) = keep_warm.and_then(Path::parent) {
        keep.push(Keep::Dir(parent.to_path_buf()));
    }
    keep
}

/// What the private root of every workspace of the state directory at
/// `home` keeps (a standby binds it ahead): its snapshots.
pub fn state_keeps(home: &Path) -> Vec<base::host::jail::Keep> {
    vec![base::host::jail::Keep::Dir(
        home.join(base::store::SNAPSHOTS_DIR),
    )]
}

/// Leaves the starter's session (so the terminal's signals do not reach
/// this process and it outlives both) and closes what it inherited
/// besides stdio and, when it has one, its owner's pidfd.
pub fn leave_starter(owner_fd: bool) {
    close_inherited_fds(owner_fd);
    // SAFETY: setsid(2) takes no arguments; it fails only when this
    // process already leads a process group, which is detached enough.
    unsafe {
        libc::setsid();
    }
}

/// Closes every descriptor this process inherited beyond stdin, stdout,
/// stderr and, with `keep_owner`, its owner's pidfd (the VMM opens what it needs itself): a descriptor leaked by
/// whatever started it must not reach the code that parses guest requests.
pub fn close_inherited_fds(keep_owner: bool) {
    let first = base::vmm::spawn::OWNER_FD as u32 + u32::from(keep_owner);
    // SAFETY: close_range takes plain integers; it closes only descriptors
    // (none is owned by Rust objects yet: this runs first thing).
    let closed = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
    if closed != 0 {
        tracing::warn!("close_range failed: {}", std::io::Error::last_os_error());
    }
}

/// Most descriptors a VMM process may hold: disks, sockets of published
/// ports and their tunnels, vsock connections.
pub const MAX_OPEN_FILES: u64 = 4096;

/// Limits what the process can open and how large a file it can write: the
/// largest file it writes is a disk copy or a memory file (for snapshots),
/// so `max(disk, memory)` plus room for logs.
pub fn limit_resources(disk_mib: u64, mem_mib: u64) -> std::io::Result<()> {
    let largest = disk_mib
        .max(mem_mib)
        .saturating_add(64)
        .saturating_mul(1 << 20);
    set_limit(libc::RLIMIT_FSIZE, largest)?;
    set_limit(libc::RLIMIT_NOFILE, MAX_OPEN_FILES)
}

/// Lowers a limit to `value` (never raises one already lower).
fn set_limit(resource: libc::__rlimit_resource_t, value: u64) -> std::io::Result<()> {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `cur` is a live rlimit the call fills.
    if unsafe { libc::getrlimit(resource, &mut cur) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let new = libc::rlimit {
        rlim_cur: cur.rlim_cur.min(value),
        rlim_max: cur.rlim_max.min(value),
    };
    // SAFETY: `new` is a valid rlimit no larger than the current one.
    if unsafe { libc::setrlimit(resource, &new) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until the process of `pidfd` ends; true when it did.
pub fn wait_for_owner_end(pidfd: &OwnedFd) -> bool {
    if base::store::process::wait_for_end(pidfd) {
        tracing::info!("the owner process ended; stopping");
        return true;
    }
    tracing::warn!("waiting for the owner process failed; not watched");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_lowered_never_raised() {
        // In a child process: limits stay with the process that set them.
        let out = std::process::Command::new("sh")
            .args(["-c", "ulimit -n 100; ulimit -n"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "100");
        let mut cur = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `cur` is a live rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) }, 0);
        let before = cur.rlim_cur;
        let wanted = before.saturating_add(1000);
        // Raising is not what set_limit does: asking for more keeps it.
        set_limit(libc::RLIMIT_NOFILE, wanted).unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) }, 0);
        assert_eq!(cur.rlim_cur, before);
    }

    /// The inode of the calling thread's network namespace.
    fn network_of_this_thread() -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
    }

    #[test]
    fn a_network_made_ahead_is_empty_and_entered_later() {
        // On a thread of its own: namespaces are the thread's, and this
        // one ends with the test.
        std::thread::spawn(|| {
            let host = network_of_this_thread();
            let ahead = match empty_network_ahead() {
                Ok(Some(ahead)) => ahead,
                Ok(None) => {
                    eprintln!("skipped: making a network namespace needs CAP_SYS_ADMIN");
                    return;
                }
                Err(e) => panic!("{e}"),
            };
            // This thread never left the host's namespace; the one made is
            // another.
            assert_eq!(network_of_this_thread(), host);
            use std::os::unix::fs::MetadataExt;
            let made = std::fs::File::from(ahead.try_clone().unwrap());
            assert_ne!(made.metadata().unwrap().ino(), host);
            leave_host_network(Some(ahead)).unwrap();
            assert_ne!(network_of_this_thread(), host);
            // Only a loopback: nothing of the host's network.
            let devices = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
            let names: Vec<&str> = devices
                .lines()
                .skip(2)
                .filter_map(|l| l.split(':').next())
                .map(str::trim)
                .collect();
            assert_eq!(names, ["lo"], "{devices}");
        })
        .join()
        .unwrap();
    }

    use base::store::process::pidfd;

    #[test]
    fn an_owner_that_ends_is_seen_and_a_gone_one_is_not_watched() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id();
        let ticks = base::store::process::start_ticks(pid).unwrap();
        let reaper = std::thread::spawn(move || child.wait());
        let watched = pidfd(pid, ticks).expect("a live owner is watched");
        assert!(
            wait_for_owner_end(&watched),
            "the end of a live owner is seen"
        );
        reaper.join().unwrap().unwrap();
        assert!(pidfd(pid, ticks).is_none(), "a gone owner is not watched");
        assert!(
            pidfd(std::process::id(), 1).is_none(),
            "another process with its pid is not it"
        );
    }
}
