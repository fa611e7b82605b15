//! A workspace's network: `user` (the default: rootless NAT through a
//! `passt` process of its own, which the VMM starts and connects to) or
//! `none` (no network device; published ports still work over vsock).
//!
//! On the `user` network every guest has the same addresses, as each has
//! its own `passt`: [`USER_GUEST_ADDR`] on [`USER_PREFIX`], the gateway
//! [`USER_GATEWAY`], which `passt` maps to the host's loopback (so host
//! services are reachable as [`HOST_ALIAS`]), and the resolver
//! [`USER_DNS`], which `passt` forwards to the host's resolver. The guest's
//! init takes them from the kernel command line (`microagent_net=`).

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub mod attach;
pub mod nft;
pub mod objects;
pub mod user_filter;

pub use crate::store::egress::{AllowEntry, Egress};
pub use crate::store::subnet::Subnet;
pub use objects::{
    Addressing, Backend, GuestNetwork, Network, NetworkError, NetworkInfo, NetworkRequest,
    NetworkStore, NetworksLock,
};

/// The name guests reach the host's loopback by, where the network allows.
pub const HOST_ALIAS: &str = "host.microagent.internal";
/// The guest's address on the `user` network.
pub const USER_GUEST_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);
/// The `user` network's prefix length.
pub const USER_PREFIX: u8 = 24;
/// The `user` network's gateway: the host's loopback as the guest sees it.
pub const USER_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// The `user` network's resolver (forwarded to the host's).
pub const USER_DNS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// `passt`'s log in the workspace directory.
pub const PASST_LOG: &str = "passt.log";

/// Checks the form of a network name a workspace asks for (whether it
/// exists is checked against [`NetworkStore`] at create).
pub fn validate_network(name: &str) -> Result<(), NetworkError> {
    crate::store::name::validate_network_name(name)
        .map_err(|e| NetworkError::Invalid(format!("network name `{name}`: {e}")))
}

/// The guest's addresses as `microagent_net=` and a restored guest's
/// agent take them: `ADDR/PREFIX,GATEWAY,DNS`.
pub fn net_setting(a: &Addressing) -> String {
    format!("{}/{},{},{}", a.guest, a.prefix, a.gateway, a.dns)
}

/// The guest's addresses on a network: what init reads from
/// `microagent_net=`; `None` for no network.
pub fn guest_cmdline(addr: Option<&Addressing>) -> Option<String> {
    addr.map(|a| {
        format!(
            "microagent_net={} microagent_host_alias={HOST_ALIAS}",
            net_setting(a)
        )
    })
}

/// A workspace's MAC address: locally administered, derived from its name
/// (stable across its starts; forks keep their snapshot's).
pub fn mac_for(workspace: &str) -> [u8; 6] {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(workspace.as_bytes());
    [0x02, 0x4d, digest[0], digest[1], digest[2], digest[3]]
}

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

/// Starts `passt` for the `user` network on one end of a new socket pair
/// and returns the other end, for the VMM's network device. It logs to
/// [`PASST_LOG`] in `dir`.
/// The gateway reaches the host's loopback only with `map_host` (a rule
/// opens a host port); otherwise it is passt's address alone. Started by
/// root, passt changes to `run_as` (uid, gid) when given, else to `nobody`.
pub fn start_passt(
    dir: &Path,
    addr: &Addressing,
    map_host: bool,
    run_as: Option<(u32, u32)>,
) -> Result<(UnixStream, Passt), NetworkError> {
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
    // SAFETY: fcntl on a descriptor this function owns.
    if alone && unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } < 0 {
        return Err(NetworkError::io("handing passt its socket".to_owned())(
            std::io::Error::last_os_error(),
        ));
    }
    if run_as.is_some() {
        // passt opens its log as root but without CAP_DAC_OVERRIDE: in a
        // directory handed to another account it can open only a file of
        // root's, made fresh here.
        let log = dir.join(PASST_LOG);
        let _ = std::fs::remove_file(&log);
        std::fs::File::create(&log)
            .map_err(NetworkError::io(format!("creating {}", log.display())))?;
    }
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
        .arg(dir.join(PASST_LOG))
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

#[cfg(test)]
mod user_filter_hostile_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::name::{NO_NETWORK, USER_NETWORK};

    #[test]
    fn passt_gets_its_end_from_a_process_of_many_threads() {
        let test = "network::tests::passt_gets_its_end_from_a_process_of_many_threads";
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
        let addr = Addressing {
            guest: Ipv4Addr::new(10, 0, 2, 15),
            prefix: 24,
            gateway: Ipv4Addr::new(10, 0, 2, 2),
            dns: Ipv4Addr::new(10, 0, 2, 3),
        };
        let (ours, passt) = start_passt(&dir, &addr, false, None).unwrap();
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
    fn network_names_are_checked_for_form() {
        validate_network(USER_NETWORK).unwrap();
        validate_network(NO_NETWORK).unwrap();
        validate_network("corp").unwrap();
        let err = validate_network("Corp Net").unwrap_err();
        assert!(err.to_string().contains("network name"), "{err}");
    }

    #[test]
    fn the_user_network_tells_init_its_addresses() {
        let user = Network::user().addressing(0);
        assert_eq!(
            guest_cmdline(user.as_ref()).unwrap(),
            "microagent_net=10.0.2.15/24,10.0.2.2,10.0.2.3 microagent_host_alias=host.microagent.internal"
        );
        assert_eq!(guest_cmdline(None), None);
        assert_eq!(user.unwrap().guest, USER_GUEST_ADDR);
        assert_eq!(user.unwrap().gateway, USER_GATEWAY);
        assert_eq!(user.unwrap().dns, USER_DNS);
        assert_eq!(user.unwrap().prefix, USER_PREFIX);
    }

    #[test]
    fn macs_are_local_unicast_and_differ_by_name() {
        let a = mac_for("a");
        assert_eq!(a[0] & 0b11, 0b10, "locally administered unicast");
        assert_eq!(a, mac_for("a"));
        assert_ne!(a, mac_for("b"));
    }
}
