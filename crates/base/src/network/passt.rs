//! The `passt` process behind a `user` network: which binary, its
//! version's known faults, and its start (for a workspace's VMM, or ahead
//! by a standby VMM before any workspace claims it).

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Addressing, NetworkError};

/// Names the `passt` binary to use instead of the system's.
pub const PASST_OVERRIDE_VAR: &str = "MICROAGENT_PASST";

/// The `passt` to run: `$MICROAGENT_PASST` when set, else the system's.
pub fn passt_binary() -> Option<PathBuf> {
    match std::env::var_os(PASST_OVERRIDE_VAR) {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => crate::host::settings::host_tool("passt"),
    }
}

/// The first `passt` snapshot with upstream commit 4e73e9b ("tcp: Don't
/// special case the handling of the ack of a syn"). Older ones reset a
/// guest's TCP connection once its peer has sent nothing for about 24 s
/// (measured: long uploads from a workspace; docs/networking.md).
pub const PASST_FIXED_SNAPSHOT: u32 = 20230327;

/// The snapshot date of the `passt` at `path`: Debian's package version
/// for Debian's binary (it reports no version itself), else the version the
/// binary was built with (`0.0~git20250503...` in ours from `cargo xtask
/// setup`), read from the file: `passt --version` exits without flushing a
/// piped stdout.
pub fn passt_snapshot(path: &Path) -> Option<u32> {
    if path == Path::new(DEBIAN_PASST) {
        return passt_snapshot_date(&crate::host::settings::deb_version("passt")?);
    }
    let bytes = std::fs::read(path).ok()?;
    let at = bytes.windows(4).position(|w| w == b"~git")?;
    let tail = &bytes[at..bytes.len().min(at + 16)];
    passt_snapshot_date(&String::from_utf8_lossy(tail))
}

/// Where Debian's `passt` package installs it.
const DEBIAN_PASST: &str = "/usr/bin/passt";

/// The snapshot date of a Debian `passt` package version
/// (`0.0~git20230309.7c7625d-1` is 20230309).
pub fn passt_snapshot_date(deb_version: &str) -> Option<u32> {
    let rest = deb_version.split("git").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    (digits.len() == 8).then(|| digits.parse().ok()).flatten()
}

/// A running `passt` serving one VMM: it ends when the VMM's end of the
/// socket closes (it is started one-off), or when this is dropped.
#[derive(Debug)]
pub struct Passt {
    child: Child,
}

impl Passt {
    /// Its process id (the VMM may signal it, and nothing else).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Passt {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a `passt` is started with besides its socket and its log: two
/// processes started with equal settings serve a guest alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PasstSetting {
    /// The guest's addresses.
    pub addressing: Addressing,
    /// The gateway reaches the host's loopback (a rule opens a host port);
    /// otherwise it is passt's address alone.
    pub map_host: bool,
    /// Started by root, passt changes to this account (uid, gid) when
    /// given, else to `nobody`.
    pub run_as: Option<(u32, u32)>,
}

/// Starts `passt` for the `user` network on one end of a new socket pair
/// and returns the other end, for the VMM's network device. It logs to
/// `log`.
pub fn start_passt(
    log: &Path,
    setting: &PasstSetting,
) -> Result<(UnixStream, Passt), NetworkError> {
    let PasstSetting {
        addressing: addr,
        map_host,
        run_as,
    } = *setting;
    let binary = passt_binary().ok_or(NetworkError::PasstMissing)?;
    let (ours, theirs) =
        UnixStream::pair().map_err(NetworkError::io("creating the socket pair for passt"))?;
    // passt's end must survive the exec. In a process of one thread (the
    // VMM's, which starts passt before any other) it is made inheritable
    // here, and the spawn needs no step in the child: a vfork and exec
    // (`posix_spawn`), not a fork of the VMM's mappings. With other
    // threads, one of them could start a program meanwhile that would
    // inherit it: it is then made inheritable in the child only.
    let alone = crate::host::settings::threads_of_this_process() == 1;
    let fd = theirs.as_raw_fd();
    if alone {
        // Nothing else the process holds reaches passt, whatever made it
        // (a standby's VM, the owner's slot): every descriptor past stdio
        // is marked close-on-exec first (kernels before 5.11 refuse the
        // flag; the VMM's own are close-on-exec where it opens them).
        // SAFETY: close_range with the CLOEXEC flag closes nothing; it
        // only marks this process's descriptors.
        unsafe {
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
        }
    }
    // SAFETY: fcntl on a descriptor this function owns.
    if alone && unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
        return Err(NetworkError::io("handing passt its socket".to_owned())(
            std::io::Error::last_os_error(),
        ));
    }
    // Made fresh here, this user's and private (never through a link):
    // passt opens its log as root but without CAP_DAC_OVERRIDE (in a
    // directory handed to another account it can open only a file of
    // root's).
    let _ = std::fs::remove_file(log);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(log)
        .map_err(NetworkError::io(format!("creating {}", log.display())))?;
    let mut cmd = Command::new(&binary);
    cmd.args(["--foreground", "--quiet", "--one-off", "--ipv4-only"])
        .arg("--fd")
        .arg(fd.to_string())
        .arg("--address")
        .arg(addr.guest.to_string())
        .arg("--netmask")
        .arg(addr.prefix.to_string())
        .arg("--gateway")
        .arg(addr.gateway.to_string())
        .arg("--dns-forward")
        .arg(addr.dns.to_string())
        .args(["--tcp-ports", "none", "--udp-ports", "none"])
        // The guest's address is set at boot (`guest_cmdline`): no DHCP
        // server, whose option table would cost 133 KiB per passt.
        .arg("--no-dhcp")
        .args((!map_host).then_some("--no-map-gw"))
        .args(run_as.map(|(uid, gid)| format!("--runas={uid}:{gid}")))
        .arg("--log-file")
        .arg(log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if !alone {
        // SAFETY: the closure runs in the child before exec and calls only
        // fcntl(2), which is async-signal-safe; `fd` stays open in the
        // parent until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn().map_err(NetworkError::io(format!(
        "starting {} for the `user` network",
        binary.display()
    )))?;
    drop(theirs);
    Ok((ours, Passt { child }))
}

/// A `passt` started before its workspace was known, by a standby VMM
/// process (issue 59: its start off a restore's path), logging into the
/// standby's directory until a workspace takes it.
#[derive(Debug)]
pub struct PasstAhead {
    setting: PasstSetting,
    /// The program it runs, as found then: one upgraded since is not
    /// taken.
    program: Option<(PathBuf, [u64; 5])>,
    started: Option<(UnixStream, Passt)>,
    log: PathBuf,
}

/// How long a passt started ahead is given to open its log, so that the
/// log moved at a claim is the one it writes.
const LOG_OPEN_WAIT: Duration = Duration::from_millis(500);

impl PasstAhead {
    /// Starts one with `setting`, logging to `log`; returns once it has
    /// written to its log (or [`LOG_OPEN_WAIT`] passed).
    pub fn start(log: PathBuf, setting: PasstSetting) -> Result<Self, NetworkError> {
        let program = passt_program();
        let started = start_passt(&log, &setting)?;
        let until = Instant::now() + LOG_OPEN_WAIT;
        while std::fs::metadata(&log).is_ok_and(|m| m.len() == 0) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(Self {
            setting,
            program,
            started: Some(started),
            log,
        })
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.started.as_ref().map(|(_, passt)| passt.pid())
    }

    /// The process and its socket for a workspace whose passt would be
    /// started with `setting`, its log moved to `log`; `None` for another
    /// setting, a passt program changed since, or a process that ended
    /// (this one then ends when dropped). A log that cannot be moved stays
    /// where it is (the sweep of the standbys' directory removes it once
    /// the process is gone): the network still works.
    pub fn take(mut self, log: &Path, setting: &PasstSetting) -> Option<(UnixStream, Passt)> {
        if self.setting != *setting || self.program.is_none() || passt_program() != self.program {
            return None;
        }
        let (_, passt) = self.started.as_mut()?;
        if !matches!(passt.child.try_wait(), Ok(None)) {
            return None;
        }
        if let Err(e) = std::fs::rename(&self.log, log) {
            tracing::warn!(
                "keeping passt's log at {} (moving it to {}: {e})",
                self.log.display(),
                log.display()
            );
        }
        self.started.take()
    }
}

/// The passt program found now and which file it is: the same path may
/// hold another program later.
fn passt_program() -> Option<(PathBuf, [u64; 5])> {
    let path = passt_binary()?;
    let identity = crate::host::settings::program_identity(&path)?;
    Some((path, identity))
}

impl Drop for PasstAhead {
    fn drop(&mut self) {
        if self.started.take().is_some() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn passt_gets_its_end_from_a_process_of_many_threads() {
        let test = "network::passt::tests::passt_gets_its_end_from_a_process_of_many_threads";
        if passt_binary().is_none() {
            crate::test_support::skip(test, "passt is not installed (apt-get install passt)");
            return;
        }
        // Another thread: the end is made inheritable in the child only.
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || wait.recv());
        assert!(crate::host::settings::threads_of_this_process() > 1);
        let dir = std::env::temp_dir().join(format!("passt-end-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let addressing = Addressing {
            guest: Ipv4Addr::new(10, 0, 2, 15),
            prefix: 24,
            gateway: Ipv4Addr::new(10, 0, 2, 2),
            dns: Ipv4Addr::new(10, 0, 2, 3),
        };
        let setting = PasstSetting {
            addressing,
            map_host: false,
            run_as: None,
        };
        let (ours, passt) = start_passt(&dir.join("passt.log"), &setting).unwrap();
        // passt holds the other end of the pair, and this process does not.
        let sockets_of = |pid: u32| {
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| std::fs::read_link(e.path()).ok())
                        .filter(|l| l.to_string_lossy().starts_with("socket:"))
                        .count()
                })
                .unwrap_or(0)
        };
        let held = (0..50).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            sockets_of(passt.pid()) > 0
        });
        assert!(held, "passt holds no socket");
        ours.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let read = std::io::Read::read(&mut &ours, &mut byte);
        assert!(
            matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the pair's other end is open: {read:?}"
        );
        drop(passt);
        done.send(()).unwrap();
        let _ = other.join();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn passt_snapshot_dates_come_from_debian_versions() {
        assert_eq!(
            passt_snapshot_date("0.0~git20230309.7c7625d-1"),
            Some(20230309)
        );
        assert_eq!(
            passt_snapshot_date("0.0~git20250503.587980c-2+deb13u1"),
            Some(20250503)
        );
        assert_eq!(passt_snapshot_date("1.0-1"), None);
        assert_eq!(passt_snapshot_date("0.0~git2023-1"), None);
        assert!(passt_snapshot_date("0.0~git20230309.7c7625d-1").unwrap() < PASST_FIXED_SNAPSHOT);
    }

    #[test]
    fn a_passt_started_ahead_serves_only_its_own_setting() {
        let test = "network::passt::tests::a_passt_started_ahead_serves_only_its_own_setting";
        if passt_binary().is_none() {
            crate::test_support::skip(test, "passt is not installed (apt-get install passt)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("passt-ahead-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let setting = PasstSetting {
            addressing: crate::network::Network::user().addressing(0).unwrap(),
            map_host: false,
            run_as: None,
        };
        let alive = |pid: u32| crate::store::process::start_ticks(pid).is_some();
        // Another setting: not taken; it ends and its log goes.
        let (ahead_log, ws_log) = (dir.join("standby.passt.log"), dir.join("passt.log"));
        let ahead = PasstAhead::start(ahead_log.clone(), setting).unwrap();
        let pid = ahead.pid().unwrap();
        let other = PasstSetting {
            map_host: true,
            ..setting
        };
        assert!(ahead.take(&ws_log, &other).is_none());
        assert!(!alive(pid), "a passt not taken still runs");
        assert!(!ahead_log.exists() && !ws_log.exists());
        // Its own: the same process, its log moved to the workspace's.
        let ahead = PasstAhead::start(ahead_log.clone(), setting).unwrap();
        let pid = ahead.pid().unwrap();
        let (_sock, passt) = ahead.take(&ws_log, &setting).unwrap();
        assert_eq!(passt.pid(), pid);
        assert!(alive(pid));
        assert!(ws_log.exists() && !ahead_log.exists());
        drop(passt);
        assert!(!alive(pid));
        // One that ended meanwhile is not taken.
        let ahead = PasstAhead::start(ahead_log.clone(), setting).unwrap();
        let pid = ahead.pid().unwrap();
        // SAFETY: kill of the child this test started.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(ahead.take(&ws_log, &setting).is_none());
        assert!(!ahead_log.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
