//! A restored guest's own identity: after a snapshot restore several VMs
//! may share one memory image, so each takes a hostname, fresh randomness
//! (mixed into the kernel's pool, then the CRNG reseeded, so no two copies
//! draw the same random numbers) and the host's wall clock.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;

use guest_agent::protocol::{AgentErrorCode, CLOCK_BEHIND_NS};

/// `_IOW('R', 0x03, int[2])`: add entropy (credited) to the input pool.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `_IO('R', 0x07)`: reseed the CRNG from the input pool now.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
/// Bytes of host randomness accepted.
const ENTROPY_BYTES: std::ops::RangeInclusive<usize> = 16..=512;
/// Longest hostname Linux takes.
const MAX_HOSTNAME: usize = 64;

/// Why the identity could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The hostname is empty, too long or has other than `a-z 0-9 - .`.
    #[error("invalid hostname {0:?}")]
    Hostname(String),
    /// The entropy is not hex, or too short or long.
    #[error("entropy must be {min} to {max} bytes of hex", min = ENTROPY_BYTES.start(), max = ENTROPY_BYTES.end())]
    Entropy,
    /// A system call failed.
    #[error("{what} failed")]
    Sys {
        /// Which call.
        what: &'static str,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

impl IdentityError {
    /// The protocol code.
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::Hostname(_) | Self::Entropy => AgentErrorCode::InvalidInput,
            Self::Sys { .. } => AgentErrorCode::Internal,
        }
    }
}

fn sys(what: &'static str) -> impl FnOnce(std::io::Error) -> IdentityError {
    move |source| IdentityError::Sys { what, source }
}

fn check(ret: libc::c_int, what: &'static str) -> Result<(), IdentityError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(sys(what)(std::io::Error::last_os_error()))
    }
}

/// Checks the hostname and decodes the entropy: nothing is changed unless
/// both are good.
fn parse(hostname: &str, entropy: &str) -> Result<Vec<u8>, IdentityError> {
    let ok_name = !hostname.is_empty()
        && hostname.len() <= MAX_HOSTNAME
        && hostname
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !ok_name {
        return Err(IdentityError::Hostname(hostname.chars().take(80).collect()));
    }
    if !entropy.len().is_multiple_of(2) || !ENTROPY_BYTES.contains(&(entropy.len() / 2)) {
        return Err(IdentityError::Entropy);
    }
    (0..entropy.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&entropy[i..i + 2], 16).map_err(|_| IdentityError::Entropy))
        .collect()
}

/// Takes the identity: hostname, randomness, clock.
pub fn take(hostname: &str, entropy: &str, unix_time_ns: u64) -> Result<(), IdentityError> {
    let bytes = parse(hostname, entropy)?;
    // SAFETY: the pointer and length describe `hostname`'s bytes.
    let ret = unsafe { libc::sethostname(hostname.as_ptr().cast(), hostname.len()) };
    check(ret, "sethostname")?;

    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + bytes.len());
    info.extend_from_slice(&((bytes.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(bytes.len() as i32).to_ne_bytes());
    info.extend_from_slice(&bytes);
    let random = OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map_err(sys("opening /dev/urandom"))?;
    // SAFETY: `info` is a complete rand_pool_info whose buf_size matches
    // the bytes that follow; the kernel only reads it.
    let ret = unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY, info.as_ptr()) };
    check(ret, "RNDADDENTROPY")?;
    // SAFETY: RNDRESEEDCRNG takes no argument.
    let ret = unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG) };
    check(ret, "RNDRESEEDCRNG")?;
    set_clock(unix_time_ns)
}

/// Held across a clock's read and set: hellos served at once (calls
/// queued during a pause) would otherwise each read the stale clock, and
/// the older time written last would take it back.
static CLOCK_SETTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn set_clock(unix_time_ns: u64) -> Result<(), IdentityError> {
    let _setting = CLOCK_SETTING.lock().unwrap_or_else(|p| p.into_inner());
    write_clock(unix_time_ns)
}

fn write_clock(unix_time_ns: u64) -> Result<(), IdentityError> {
    let now = libc::timespec {
        tv_sec: (unix_time_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (unix_time_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `now` is a valid timespec; the kernel only reads it.
    let ret = unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &now) };
    check(ret, "clock_settime")
}

/// Whether a guest clock reading `guest_ns` is far enough behind the
/// host's `host_ns` to be set. Never back: a hello read late carries an
/// older time than the guest's.
fn behind(guest_ns: u64, host_ns: u64) -> bool {
    host_ns.saturating_sub(guest_ns) > CLOCK_BEHIND_NS
}

/// Sets the clock to the host's `host_ns` (as a hello carries it) when it
/// is behind: the VMM stops the guest's clock while it is paused. Whether
/// it was set.
pub fn catch_up_clock(host_ns: u64) -> Result<bool, IdentityError> {
    let _setting = CLOCK_SETTING.lock().unwrap_or_else(|p| p.into_inner());
    let guest_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    if !behind(guest_ns, host_ns) {
        return Ok(false);
    }
    write_clock(host_ns)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_is_set_only_forward_and_only_when_well_behind() {
        let host = 1_800_000_000_000_000_000;
        assert!(behind(host - 60_000_000_000, host), "a minute's pause");
        assert!(behind(0, host));
        assert!(!behind(host - CLOCK_BEHIND_NS, host), "within the slack");
        assert!(!behind(host, host));
        assert!(!behind(host + 5_000_000_000, host), "never back");
    }

    #[test]
    fn hostname_and_entropy_are_checked_before_anything_changes() {
        let hex = "ab".repeat(32);
        assert_eq!(parse("fork-1", &hex).unwrap(), vec![0xab; 32]);
        for bad in ["", "UPPER", "with space", &"x".repeat(65), "semi;colon"] {
            assert!(
                matches!(parse(bad, &hex), Err(IdentityError::Hostname(_))),
                "{bad:?}"
            );
        }
        for bad in [
            "abc",
            "zz".repeat(32).as_str(),
            &"ab".repeat(8 - 1),
            &"ab".repeat(513),
        ] {
            assert!(
                matches!(parse("ok", bad), Err(IdentityError::Entropy)),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse("ok", "zz").unwrap_err().code(),
            AgentErrorCode::InvalidInput
        );
    }
}
