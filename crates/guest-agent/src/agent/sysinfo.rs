//! `info`: uname, /proc/uptime, /proc/meminfo, /proc/loadavg, and statvfs
//! of the real mounts in /proc/self/mounts.

use std::ffi::{CStr, CString};
use std::io;

use guest_agent::protocol::{AgentErrorCode, CpuTicks, DiskUsage, NetCounters, SystemInfo};

/// Filesystem types reported besides block-device mounts.
const NETWORK_OR_LAYERED: &[&str] = &["overlay", "virtiofs", "9p", "nfs", "nfs4", "fuse"];
/// Most mounts reported.
const MAX_DISKS: usize = 64;

/// Why `info` failed.
#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    /// uname() failed.
    #[error("uname")]
    Uname(#[source] io::Error),
    /// A /proc file could not be read.
    #[error("reading {path}")]
    Proc {
        path: &'static str,
        #[source]
        source: io::Error,
    },
}

impl InfoError {
    pub fn code(&self) -> AgentErrorCode {
        AgentErrorCode::Internal
    }
}

fn proc_file(path: &'static str) -> Result<String, InfoError> {
    std::fs::read_to_string(path).map_err(|source| InfoError::Proc { path, source })
}

/// Collects the `info` answer.
pub fn collect() -> Result<SystemInfo, InfoError> {
    let (kernel, hostname) = uname()?;
    let uptime_s = proc_file("/proc/uptime")?
        .split_whitespace()
        .next()
        .and_then(|s| s.parse::<f64>().ok())
        .map_or(0, |s| s as u64);
    let meminfo = proc_file("/proc/meminfo")?;
    let mut load = [0.0; 3];
    for (slot, field) in load
        .iter_mut()
        .zip(proc_file("/proc/loadavg")?.split_whitespace())
    {
        *slot = field.parse().unwrap_or(0.0);
    }
    Ok(SystemInfo {
        kernel,
        hostname,
        uptime_s,
        mem_total_kib: meminfo_kib(&meminfo, "MemTotal"),
        mem_available_kib: meminfo_kib(&meminfo, "MemAvailable"),
        load,
        disks: disks(&proc_file("/proc/self/mounts")?),
        // SAFETY: sysconf has no memory arguments.
        cpus: u32::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(0),
        cpu_ticks: proc_file("/proc/stat").ok().and_then(|s| cpu_ticks(&s)),
        net: proc_file("/proc/net/dev").ok().map(|s| net_counters(&s)),
    })
}

/// The `cpu` line of /proc/stat: user nice system idle iowait irq softirq
/// steal ...; idle and iowait are not busy.
fn cpu_ticks(stat: &str) -> Option<CpuTicks> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some(CpuTicks {
        busy: total.saturating_sub(idle),
        total,
    })
}

/// The sums over every interface but `lo` of /proc/net/dev.
fn net_counters(dev: &str) -> NetCounters {
    let mut sum = NetCounters::default();
    for line in dev.lines().skip(2) {
        let Some((name, counters)) = line.split_once(':') else {
            continue;
        };
        if name.trim() == "lo" {
            continue;
        }
        let f: Vec<u64> = counters
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        if f.len() < 10 {
            continue;
        }
        sum.rx_bytes += f[0];
        sum.rx_packets += f[1];
        sum.tx_bytes += f[8];
        sum.tx_packets += f[9];
    }
    sum
}

fn uname() -> Result<(String, String), InfoError> {
    // SAFETY: utsname is plain data; all zeroes is a valid value.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid utsname for uname to fill.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return Err(InfoError::Uname(io::Error::last_os_error()));
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let hostname = field(&uts.nodename);
    let kernel = format!(
        "{} {} {} {} {}",
        field(&uts.sysname),
        hostname,
        field(&uts.release),
        field(&uts.version),
        field(&uts.machine)
    );
    Ok((kernel, hostname))
}

pub(super) fn meminfo_kib(meminfo: &str, key: &str) -> u64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Decodes the octal escapes (`\040` for a space) of /proc/self/mounts.
pub(super) fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `/` and the mounts of block devices and of overlay/network filesystems,
/// once each, with their usage.
fn disks(mounts: &str) -> Vec<DiskUsage> {
    let mut seen: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for line in mounts.lines() {
        let mut fields = line.split(' ');
        let (Some(source), Some(mount), Some(fstype)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let mount = unescape(mount);
        let real =
            mount == "/" || source.starts_with("/dev/") || NETWORK_OR_LAYERED.contains(&fstype);
        if !real || seen.contains(&mount) || out.len() == MAX_DISKS {
            continue;
        }
        seen.push(mount.clone());
        if let Some((total_bytes, avail_bytes)) = statvfs(&mount) {
            out.push(DiskUsage {
                mount,
                total_bytes,
                avail_bytes,
            });
        }
    }
    // The root first.
    out.sort_by_key(|d| d.mount != "/");
    out
}

fn statvfs(path: &str) -> Option<(u64, u64)> {
    let path = CString::new(path).ok()?;
    // SAFETY: statvfs is plain data; all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let path: &CStr = &path;
    // SAFETY: `path` is NUL-terminated and `st` is valid for statvfs to fill.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize;
    Some((
        st.f_blocks.saturating_mul(frsize),
        st.f_bavail.saturating_mul(frsize),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_count_idle_and_iowait_as_not_busy() {
        let stat = "cpu  10 1 5 100 4 0 2 0 0 0\ncpu0 10 1 5 100 4 0 2 0 0 0\nintr 5\n";
        assert_eq!(
            cpu_ticks(stat),
            Some(CpuTicks {
                busy: 18,
                total: 122
            })
        );
        assert_eq!(cpu_ticks("intr 5\n"), None);
    }

    #[test]
    fn net_counters_sum_every_interface_but_loopback() {
        let dev = "Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes packets\n    lo: 100 2 0 0 0 0 0 0 100 2 0 0 0 0 0 0\n  eth0: 1000 10 0 0 0 0 0 0 500 5 0 0 0 0 0 0\n  eth1: 1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n";
        assert_eq!(
            net_counters(dev),
            NetCounters {
                rx_bytes: 1001,
                tx_bytes: 501,
                rx_packets: 11,
                tx_packets: 6
            }
        );
    }

    #[test]
    fn mounts_are_filtered_and_unescaped() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape(r"/x\\y"), r"/x\\y");
        let mounts = "proc /proc proc rw 0 0\n/dev/root / ext4 rw 0 0\ntmpfs /run tmpfs rw 0 0\n";
        let d = disks(mounts);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].mount, "/");
        assert!(d[0].total_bytes > 0);
        assert_eq!(
            meminfo_kib("MemTotal:  1024 kB\nMemAvailable: 5 kB\n", "MemAvailable"),
            5
        );
    }

    #[test]
    fn info_reads_this_machine() {
        let info = collect().unwrap();
        assert!(info.kernel.starts_with("Linux "));
        assert!(info.mem_total_kib > 0);
        assert!(info.disks.iter().any(|d| d.mount == "/"));
    }
}
