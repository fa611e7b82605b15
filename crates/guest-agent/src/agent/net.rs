//! The guest's network, set up by the agent as PID 1 from the kernel
//! command line (`microagent_net=ADDR/PREFIX,GATEWAY,DNS` and
//! `microagent_host_alias=NAME` in /proc/cmdline): the loopback up (published ports
//! connect to 127.0.0.1 in the guest), `eth0` with its address and default
//! route, the resolver in /etc/resolv.conf, and the host's alias in
//! /etc/hosts. Without the setting only the loopback comes up.

use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The first (and only) virtio-net interface.
const INTERFACE: &str = "eth0";

/// What `microagent_net=` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetSetup {
    /// The guest's address.
    pub addr: Ipv4Addr,
    /// Its prefix length.
    pub prefix: u8,
    /// The default route's gateway.
    pub gateway: Ipv4Addr,
    /// The resolver.
    pub dns: Ipv4Addr,
}

/// Why the network could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetSetupError {
    /// The setting does not parse.
    #[error("microagent_net={0:?} is not ADDR/PREFIX,GATEWAY,DNS")]
    Setting(String),
    /// An interface or route request failed.
    #[error("{what} {interface}")]
    Ioctl {
        /// What was asked.
        what: &'static str,
        /// The interface.
        interface: &'static str,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A MAC address does not parse.
    #[error("{0:?} is not a unicast MAC address (02:4d:00:11:22:33)")]
    Mac(String),
    /// /etc/resolv.conf or /etc/hosts could not be written.
    #[error("writing {0}")]
    File(&'static str, #[source] io::Error),
}

impl NetSetupError {
    /// The protocol code.
    pub fn code(&self) -> guest_agent::protocol::AgentErrorCode {
        use guest_agent::protocol::AgentErrorCode;
        match self {
            Self::Setting(_) | Self::Mac(_) => AgentErrorCode::InvalidInput,
            Self::Ioctl { .. } | Self::File(..) => AgentErrorCode::Internal,
        }
    }
}

/// Parses `02:4d:00:11:22:33`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], NetSetupError> {
    let bad = || NetSetupError::Mac(s.chars().take(40).collect());
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(parts) {
        if part.len() != 2 {
            return Err(bad());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
    }
    // Unicast only: a multicast source address is not an interface's.
    if mac[0] & 1 != 0 {
        return Err(bad());
    }
    Ok(mac)
}

/// The setup `eth0` has now (set by [`configure`]); a restored guest's
/// agent remembers it from before the snapshot.
static CONFIGURED: std::sync::Mutex<Option<NetSetup>> = std::sync::Mutex::new(None);

/// A restored guest's new network (`setting` as `microagent_net=` has
/// it) and MAC. The same setup as before the snapshot (every guest of the
/// built-in network has the same addresses) keeps `eth0` up and only
/// takes the MAC (virtio-net changes it live) and forgets its neighbours'
/// link addresses (another network's bridge, or peers made again since,
/// may answer there now): taking the interface down and up costs a guest
/// whose kernel is emulated about a second. Another setup takes `eth0` down (which drops its routes and
/// neighbours of the old network), gives it the MAC and address, and
/// brings it back up with the new route and resolver. Nothing changes
/// unless both parse.
pub fn readdress(setting: &str, mac: Option<&str>) -> Result<(), NetSetupError> {
    let setup = NetSetup::parse(setting)?;
    let mac = mac.map(parse_mac).transpose()?;
    // One at a time: a host that retries a call whose connection broke
    // may have a second one arrive while the first still works.
    static READDRESSING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = READDRESSING.lock().unwrap_or_else(|p| p.into_inner());
    let sock = inet_socket().map_err(|source| NetSetupError::Ioctl {
        what: "opening a socket for",
        interface: INTERFACE,
        source,
    })?;
    let unchanged = CONFIGURED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        == Some(&setup);
    if unchanged {
        let live = mac.map_or(Ok(()), |mac| set_mac(&sock, mac));
        if live.is_ok() {
            let arp = std::fs::read_to_string("/proc/net/arp").unwrap_or_default();
            for neighbour in neighbours(&arp, INTERFACE) {
                forget_neighbour(&sock, neighbour)?;
            }
            return Ok(());
        }
    }
    // Until `configure` finishes, the interface has no known setup.
    *CONFIGURED.lock().unwrap_or_else(|p| p.into_inner()) = None;
    set_flags(&sock, INTERFACE, false)?;
    if let Some(mac) = mac {
        set_mac(&sock, mac)?;
    }
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    configure(Some(&setup), from_cmdline(&cmdline).1)
}

fn set_mac(sock: &OwnedFd, mac: [u8; 6]) -> Result<(), NetSetupError> {
    let mut req = ifreq(INTERFACE);
    // SAFETY: sockaddr is plain data; all-zero is a valid value.
    let mut hw: libc::sockaddr = unsafe { std::mem::zeroed() };
    hw.sa_family = libc::ARPHRD_ETHER;
    for (dst, src) in hw.sa_data.iter_mut().zip(mac) {
        *dst = src as libc::c_char;
    }
    req.ifr_ifru.ifru_hwaddr = hw;
    ioctl(
        sock,
        libc::SIOCSIFHWADDR,
        (&mut req as *mut libc::ifreq).cast(),
        "setting the MAC address of",
        INTERFACE,
    )
}

/// The addresses `/proc/net/arp` (its text `arp`) has neighbour entries
/// for on `interface`.
fn neighbours(arp: &str, interface: &str) -> Vec<Ipv4Addr> {
    arp.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match fields.as_slice() {
                [addr, .., device] if *device == interface => addr.parse().ok(),
                _ => None,
            }
        })
        .collect()
}

/// Drops the neighbour entry of `addr` on `eth0`, if there is one.
fn forget_neighbour(sock: &OwnedFd, addr: Ipv4Addr) -> Result<(), NetSetupError> {
    // SAFETY: arpreq is plain data; all-zero is a valid value.
    let mut req: libc::arpreq = unsafe { std::mem::zeroed() };
    req.arp_pa = sockaddr(addr);
    for (dst, src) in req.arp_dev.iter_mut().zip(INTERFACE.bytes()) {
        *dst = src as libc::c_char;
    }
    match ioctl(
        sock,
        libc::SIOCDARP,
        (&mut req as *mut libc::arpreq).cast(),
        "forgetting a neighbour's link address on",
        INTERFACE,
    ) {
        // None was there: nothing to forget.
        Err(NetSetupError::Ioctl { source, .. }) if source.raw_os_error() == Some(libc::ENXIO) => {
            Ok(())
        }
        other => other,
    }
}

impl NetSetup {
    /// Parses `ADDR/PREFIX,GATEWAY,DNS`.
    pub fn parse(value: &str) -> Result<Self, NetSetupError> {
        let bad = || NetSetupError::Setting(value.to_owned());
        let mut parts = value.split(',');
        let (Some(cidr), Some(gateway), Some(dns), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let (addr, prefix) = cidr.split_once('/').ok_or_else(bad)?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        if prefix > 32 {
            return Err(bad());
        }
        Ok(Self {
            addr: addr.parse().map_err(|_| bad())?,
            prefix,
            gateway: gateway.parse().map_err(|_| bad())?,
            dns: dns.parse().map_err(|_| bad())?,
        })
    }

    /// The netmask of the prefix.
    pub fn netmask(&self) -> Ipv4Addr {
        let bits = u32::MAX
            .checked_shl(32 - u32::from(self.prefix))
            .unwrap_or(0);
        Ipv4Addr::from(bits)
    }
}

/// The network settings of a kernel command line: the setup (if asked,
/// and whether it parses) and the host's alias.
pub fn from_cmdline(cmdline: &str) -> (Option<Result<NetSetup, NetSetupError>>, Option<&str>) {
    let value = |key: &str| {
        cmdline
            .split_whitespace()
            .find_map(|arg| arg.strip_prefix(key)?.strip_prefix('='))
    };
    (
        value("microagent_net").map(NetSetup::parse),
        value("microagent_host_alias").filter(|a| !a.is_empty()),
    )
}

/// Sets up the network the kernel command line describes, logging what
/// fails (the agent serves on without a network).
pub fn configure_from_cmdline() {
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let (setup, alias) = from_cmdline(&cmdline);
    let setup = match setup.transpose() {
        Ok(setup) => setup,
        Err(e) => {
            eprintln!("microagent-agent: {e}; the guest has no network");
            None
        }
    };
    if let Err(e) = configure(setup.as_ref(), alias) {
        eprintln!(
            "microagent-agent: network setup failed: {}",
            super::error_chain(&e)
        );
    }
}

/// The resolver configuration for `dns`.
pub fn resolv_conf(dns: Ipv4Addr) -> String {
    format!("# written by microagent-agent\nnameserver {dns}\n")
}

/// `hosts` with `alias` pointing at `addr` (an older line for the alias is
/// replaced) and localhost present.
pub fn hosts_with(hosts: &str, alias: &str, addr: Ipv4Addr) -> String {
    let mut out: String = hosts
        .lines()
        .filter(|l| !l.split_whitespace().skip(1).any(|name| name == alias))
        .map(|l| format!("{l}\n"))
        .collect();
    if !out
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("localhost"))
    {
        out.insert_str(0, "127.0.0.1\tlocalhost\n");
    }
    out.push_str(&format!("{addr}\t{alias}\n"));
    out
}

/// Brings the loopback up and, when `setup` is given, `eth0`, its route
/// and the resolver; `alias` names the gateway in /etc/hosts.
pub fn configure(setup: Option<&NetSetup>, alias: Option<&str>) -> Result<(), NetSetupError> {
    let sock = inet_socket().map_err(|source| NetSetupError::Ioctl {
        what: "opening a socket for",
        interface: INTERFACE,
        source,
    })?;
    set_up(&sock, "lo")?;
    let Some(setup) = setup else {
        return Ok(());
    };
    set_addr(
        &sock,
        libc::SIOCSIFADDR,
        setup.addr,
        "setting the address of",
    )?;
    set_addr(
        &sock,
        libc::SIOCSIFNETMASK,
        setup.netmask(),
        "setting the netmask of",
    )?;
    set_up(&sock, INTERFACE)?;
    add_default_route(&sock, setup.gateway)?;
    std::fs::write("/etc/resolv.conf", resolv_conf(setup.dns))
        .map_err(|e| NetSetupError::File("/etc/resolv.conf", e))?;
    if let Some(alias) = alias {
        edit_hosts(HOSTS, |hosts| hosts_with(hosts, alias, setup.gateway))
            .map_err(|e| NetSetupError::File("/etc/hosts", e))?;
    }
    *CONFIGURED.lock().unwrap_or_else(|p| p.into_inner()) = Some(setup.clone());
    Ok(())
}

/// The guest's hosts file.
pub const HOSTS: &str = "/etc/hosts";
/// The largest hosts file the agent edits.
const MAX_HOSTS_BYTES: u64 = 1 << 20;
/// One edit of the hosts file at a time (the network's alias, forwards).
static HOSTS_EDIT: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Rewrites the hosts file at `path` as `edit` makes it from what it holds
/// (none when missing): read without following a link, only a regular
/// file of at most 1 MiB and UTF-8, then replaced whole (a temporary
/// beside it, renamed over it), so a failure leaves it as it was.
pub fn edit_hosts(path: &str, edit: impl FnOnce(&str) -> String) -> io::Result<()> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let _one = HOSTS_EDIT.lock().unwrap_or_else(|e| e.into_inner());
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let mut before = String::new();
    let mut perm = None;
    match opened {
        Ok(file) => {
            let meta = file.metadata()?;
            if !meta.is_file() || meta.len() > MAX_HOSTS_BYTES {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{path} is not a regular file of at most 1 MiB"),
                ));
            }
            file.take(MAX_HOSTS_BYTES).read_to_string(&mut before)?;
            perm = Some(meta.permissions());
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let tmp = format!("{path}.microagent.tmp");
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o644)
            .open(&tmp)?;
        file.write_all(edit(&before).as_bytes())?;
        if let Some(perm) = perm {
            file.set_permissions(perm)?;
        }
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn inet_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes integer arguments; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    req
}

fn sockaddr(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) and
    // the kernel reads an AF_INET sockaddr as a sockaddr_in.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ioctl(
    sock: &OwnedFd,
    request: libc::Ioctl,
    arg: *mut libc::c_void,
    what: &'static str,
    interface: &'static str,
) -> Result<(), NetSetupError> {
    // SAFETY: every caller passes a request whose argument is the
    // structure `arg` points to, owned by the caller for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request, arg) } < 0 {
        return Err(NetSetupError::Ioctl {
            what,
            interface,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn set_up(sock: &OwnedFd, name: &'static str) -> Result<(), NetSetupError> {
    set_flags(sock, name, true)
}

fn set_flags(sock: &OwnedFd, name: &'static str, up: bool) -> Result<(), NetSetupError> {
    let mut req = ifreq(name);
    ioctl(
        sock,
        libc::SIOCGIFFLAGS,
        (&mut req as *mut libc::ifreq).cast(),
        "reading the flags of",
        name,
    )?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    let bits = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    req.ifr_ifru.ifru_flags = if up { flags | bits } else { flags & !bits };
    ioctl(
        sock,
        libc::SIOCSIFFLAGS,
        (&mut req as *mut libc::ifreq).cast(),
        if up { "bringing up" } else { "taking down" },
        name,
    )
}

fn set_addr(
    sock: &OwnedFd,
    request: libc::Ioctl,
    addr: Ipv4Addr,
    what: &'static str,
) -> Result<(), NetSetupError> {
    let mut req = ifreq(INTERFACE);
    req.ifr_ifru.ifru_addr = sockaddr(addr);
    ioctl(
        sock,
        request,
        (&mut req as *mut libc::ifreq).cast(),
        what,
        INTERFACE,
    )
}

/// `struct rtentry` of <linux/route.h> (x86_64 layout; glibc's libc
/// bindings do not carry it).
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

/// RTF_UP | RTF_GATEWAY.
const RTF_UP_GATEWAY: libc::c_ushort = 0x0001 | 0x0002;

fn add_default_route(sock: &OwnedFd, gateway: Ipv4Addr) -> Result<(), NetSetupError> {
    let mut route = RtEntry {
        rt_pad1: 0,
        rt_dst: sockaddr(Ipv4Addr::UNSPECIFIED),
        rt_gateway: sockaddr(gateway),
        rt_genmask: sockaddr(Ipv4Addr::UNSPECIFIED),
        rt_flags: RTF_UP_GATEWAY,
        rt_pad2: 0,
        rt_pad3: 0,
        rt_pad4: std::ptr::null_mut(),
        rt_metric: 0,
        rt_dev: std::ptr::null_mut(),
        rt_mtu: 0,
        rt_window: 0,
        rt_irtt: 0,
    };
    match ioctl(
        sock,
        libc::SIOCADDRT,
        (&mut route as *mut RtEntry).cast(),
        "adding the default route via",
        INTERFACE,
    ) {
        // Already there (a second call): what was asked holds.
        Err(NetSetupError::Ioctl { source, .. }) if source.raw_os_error() == Some(libc::EEXIST) => {
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_are_read_per_interface() {
        let arp =
            "IP address       HW type     Flags       HW address            Mask     Device\n\
                   10.0.2.2         0x1         0x2         9a:55:9a:55:9a:55     *        eth0\n\
                   10.0.2.3         0x1         0x2         9a:55:9a:55:9a:55     *        eth0\n\
                   10.9.0.1         0x1         0x2         02:00:00:00:00:01     *        eth1\n\
                   garbage\n";
        assert_eq!(
            neighbours(arp, "eth0"),
            [Ipv4Addr::new(10, 0, 2, 2), Ipv4Addr::new(10, 0, 2, 3)]
        );
        assert!(neighbours("", "eth0").is_empty());
    }

    #[test]
    fn macs_parse_and_only_unicast_ones() {
        assert_eq!(
            parse_mac("02:4d:0a:ff:00:01").unwrap(),
            [2, 0x4d, 0x0a, 0xff, 0, 1]
        );
        for bad in [
            "",
            "02:4d:0a:ff:00",
            "02:4d:0a:ff:00:01:02",
            "03:00:00:00:00:00",
            "2:4d:0a:ff:00:01",
            "zz:4d:0a:ff:00:01",
        ] {
            assert!(parse_mac(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parses_the_setting_and_refuses_anything_else() {
        let s = NetSetup::parse("10.0.2.15/24,10.0.2.2,10.0.2.3").unwrap();
        assert_eq!(s.addr, Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(s.netmask(), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(s.gateway, Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(s.dns, Ipv4Addr::new(10, 0, 2, 3));
        for bad in [
            "",
            "10.0.2.15,10.0.2.2,10.0.2.3",
            "10.0.2.15/33,10.0.2.2,10.0.2.3",
            "10.0.2.15/24,10.0.2.2",
            "10.0.2.15/24,10.0.2.2,10.0.2.3,x",
            "10.0.2/24,10.0.2.2,10.0.2.3",
        ] {
            assert!(NetSetup::parse(bad).is_err(), "{bad:?} parsed");
        }
        let all = NetSetup::parse("10.0.0.1/0,10.0.0.2,10.0.0.3").unwrap();
        assert_eq!(all.netmask(), Ipv4Addr::UNSPECIFIED);
    }

    #[test]
    fn the_hosts_file_is_edited_only_as_a_small_regular_file_and_whole() {
        let dir = std::env::temp_dir().join(format!("ga-hosts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hosts");
        let p = path.to_str().unwrap();
        // Missing: made.
        edit_hosts(p, |h| format!("{h}a\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\n");
        // Kept as it was, with its permissions.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        edit_hosts(p, |h| format!("{h}b\n")).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nb\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        // Not UTF-8, a link, a FIFO, too large: refused, nothing changed.
        std::fs::write(&path, b"\xff\xfe").unwrap();
        assert!(edit_hosts(p, |_| "x".into()).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"\xff\xfe");
        let target = dir.join("target");
        std::fs::write(&target, "t\n").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(edit_hosts(p, |_| "x".into()).is_err());
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "t\n");
        std::fs::remove_file(&path).unwrap();
        let fifo = std::ffi::CString::new(p).unwrap();
        // SAFETY: mkfifo with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(edit_hosts(p, |_| "x".into()).is_err(), "a FIFO is no file");
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, vec![b'#'; (MAX_HOSTS_BYTES + 1) as usize]).unwrap();
        assert!(edit_hosts(p, |_| "x".into()).is_err());
        assert!(
            !dir.join("hosts.microagent.tmp").exists(),
            "no temporary left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hosts_gain_the_alias_once_and_keep_the_rest() {
        let alias = "host.microagent.internal";
        let gw = Ipv4Addr::new(10, 0, 2, 2);
        let fresh = hosts_with("", alias, gw);
        assert_eq!(
            fresh,
            "127.0.0.1\tlocalhost\n10.0.2.2\thost.microagent.internal\n"
        );
        let again = hosts_with(&fresh, alias, gw);
        assert_eq!(again, fresh, "idempotent");
        let debian =
            "127.0.0.1 localhost\n::1 localhost ip6-localhost\n10.9.9.9 host.microagent.internal\n";
        let updated = hosts_with(debian, alias, gw);
        assert!(updated.starts_with("127.0.0.1 localhost\n::1 localhost ip6-localhost\n"));
        assert!(!updated.contains("10.9.9.9"));
        assert!(updated.ends_with("10.0.2.2\thost.microagent.internal\n"));
    }

    #[test]
    fn reads_its_settings_from_the_command_line() {
        let (setup, alias) = from_cmdline(
            "console=ttyS0 microagent_hostname=w1 microagent_net=10.0.2.15/24,10.0.2.2,10.0.2.3 microagent_host_alias=host.microagent.internal",
        );
        assert_eq!(setup.unwrap().unwrap().addr, Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(alias, Some("host.microagent.internal"));
        let (setup, alias) = from_cmdline("console=ttyS0 microagent_netx=1");
        assert!(setup.is_none());
        assert!(alias.is_none());
        assert!(from_cmdline("microagent_net=junk").0.unwrap().is_err());
    }

    #[test]
    fn the_route_entry_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<RtEntry>(), 120);
        assert_eq!(
            resolv_conf(Ipv4Addr::new(10, 0, 2, 3)).lines().last(),
            Some("nameserver 10.0.2.3")
        );
    }
}
