//! What the balloon knows about its guest's memory: the statistics the
//! driver last sent and how much free memory it reported, shared between
//! the device (event loop thread) and whoever asks (the VMM's control
//! socket), and kept in snapshots.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::EventFd;

/// Size of one statistic in the driver's buffer: a `u16` tag and a `u64`
/// value, packed, little-endian.
pub const STAT_LEN: usize = 10;
/// Most statistics read from one buffer (the spec defines 10 tags; later
/// drivers may send more, which are skipped).
pub const MAX_STATS: usize = 32;

/// The guest's memory statistics, as its balloon driver reports them
/// (virtio spec 5.5.6.3; each `None` when the driver did not send it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestMemoryStats {
    /// Bytes swapped in.
    pub swap_in_bytes: Option<u64>,
    /// Bytes swapped out.
    pub swap_out_bytes: Option<u64>,
    /// Major page faults.
    pub major_faults: Option<u64>,
    /// Minor page faults.
    pub minor_faults: Option<u64>,
    /// Free memory, bytes.
    pub free_bytes: Option<u64>,
    /// Total memory, bytes.
    pub total_bytes: Option<u64>,
    /// Memory available for new work without swapping, bytes.
    pub available_bytes: Option<u64>,
    /// Memory in the page cache (which can be dropped), bytes.
    pub disk_caches_bytes: Option<u64>,
}

impl GuestMemoryStats {
    /// Reads the packed (tag, value) pairs of a stats buffer; unknown tags
    /// and a trailing partial entry are ignored.
    pub fn parse(buf: &[u8]) -> Self {
        let mut stats = Self::default();
        for entry in buf.chunks_exact(STAT_LEN).take(MAX_STATS) {
            let tag = u16::from_le_bytes([entry[0], entry[1]]);
            let mut value = [0u8; 8];
            value.copy_from_slice(&entry[2..]);
            let value = Some(u64::from_le_bytes(value));
            match tag {
                0 => stats.swap_in_bytes = value,
                1 => stats.swap_out_bytes = value,
                2 => stats.major_faults = value,
                3 => stats.minor_faults = value,
                4 => stats.free_bytes = value,
                5 => stats.total_bytes = value,
                6 => stats.available_bytes = value,
                7 => stats.disk_caches_bytes = value,
                _ => {}
            }
        }
        stats
    }
}

/// Everything the balloon has to say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonFigures {
    /// Bytes of free guest memory the driver reported and the host dropped
    /// (each report counted, so memory freed twice counts twice).
    pub reported_bytes: u64,
    /// Reports served.
    pub reports: u64,
    /// The driver's last statistics (None until it sent any).
    pub stats: Option<GuestMemoryStats>,
    /// How many times the driver has sent statistics.
    pub stats_updates: u64,
}

/// The figures and the request line for fresh statistics, shared by the
/// device and its handles.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) figures: Mutex<BalloonFigures>,
    pub(super) updated: Condvar,
    /// Written by a handle that wants fresh statistics; the device watches it.
    pub(super) refresh: EventFd,
}

impl Shared {
    pub(super) fn new(refresh: EventFd, figures: BalloonFigures) -> Self {
        Self {
            figures: Mutex::new(figures),
            updated: Condvar::new(),
            refresh,
        }
    }

    pub(super) fn figures(&self) -> std::sync::MutexGuard<'_, BalloonFigures> {
        self.figures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records statistics the driver just sent and wakes whoever waits.
    pub(super) fn stats_arrived(&self, stats: GuestMemoryStats) {
        let mut figures = self.figures();
        figures.stats = Some(stats);
        figures.stats_updates += 1;
        self.updated.notify_all();
    }
}

/// Reads the balloon's figures from another thread.
#[derive(Clone, Debug)]
pub struct BalloonHandle {
    pub(super) shared: std::sync::Arc<Shared>,
}

impl BalloonHandle {
    /// The figures as they stand.
    pub fn figures(&self) -> BalloonFigures {
        *self.shared.figures()
    }

    /// Asks the driver for fresh statistics and waits up to `timeout` for
    /// them; a guest that does not answer in time (paused, busy, or with no
    /// buffer queued yet) leaves the last ones, which the answer's
    /// `stats_updates` shows.
    pub fn fresh_figures(&self, timeout: Duration) -> BalloonFigures {
        let before = self.shared.figures().stats_updates;
        if let Err(e) = self.shared.refresh.write(1) {
            tracing::warn!("balloon: cannot ask for statistics: {e}");
            return self.figures();
        }
        let deadline = Instant::now() + timeout;
        let mut figures = self.shared.figures();
        while figures.stats_updates == before {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            figures = self
                .shared
                .updated
                .wait_timeout(figures, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *figures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: u16, value: u64) -> Vec<u8> {
        [&tag.to_le_bytes()[..], &value.to_le_bytes()].concat()
    }

    #[test]
    fn stats_are_read_by_tag() {
        let buf = [entry(4, 100), entry(5, 400), entry(99, 7), entry(7, 50)].concat();
        let stats = GuestMemoryStats::parse(&buf);
        assert_eq!(stats.free_bytes, Some(100));
        assert_eq!(stats.total_bytes, Some(400));
        assert_eq!(stats.disk_caches_bytes, Some(50));
        assert_eq!(stats.available_bytes, None);
    }

    #[test]
    fn a_partial_entry_is_ignored() {
        let mut buf = entry(6, 9);
        buf.extend_from_slice(&[4, 0, 1]);
        let stats = GuestMemoryStats::parse(&buf);
        assert_eq!(stats.available_bytes, Some(9));
        assert_eq!(stats.free_bytes, None);
    }

    #[test]
    fn fresh_figures_wait_for_the_driver_then_give_up() {
        let shared = std::sync::Arc::new(Shared::new(
            EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap(),
            BalloonFigures::default(),
        ));
        let handle = BalloonHandle {
            shared: shared.clone(),
        };
        let guest = std::thread::spawn(move || {
            // The device sees the request, the driver answers.
            while shared.refresh.read().is_err() {
                std::thread::sleep(Duration::from_millis(1));
            }
            shared.stats_arrived(GuestMemoryStats {
                free_bytes: Some(1),
                ..Default::default()
            });
        });
        let got = handle.fresh_figures(Duration::from_secs(10));
        guest.join().unwrap();
        assert_eq!(got.stats_updates, 1);
        assert_eq!(got.stats.unwrap().free_bytes, Some(1));
        // Nobody answers now: the last figures come back after the timeout.
        let again = handle.fresh_figures(Duration::from_millis(20));
        assert_eq!(again, got);
    }
}
