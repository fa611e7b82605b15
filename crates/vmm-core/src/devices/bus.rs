//! Address-range dispatch of port I/O and MMIO exits to devices.

use std::sync::{Arc, Mutex};

/// What a device asks of the VM after an access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceAction {
    /// Nothing.
    None,
    /// The guest asked for a reset (reboot); the VM ends.
    Reset,
}

/// A device on a bus. Offsets are relative to the start of its range.
pub trait BusDevice: Send {
    /// Fills `data` for a guest read at `offset`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// Takes a guest write at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]) -> DeviceAction;
}

/// A device shared between vCPU threads.
pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// Why a device could not be put on the bus.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// Its range overlaps one already taken.
    #[error("range {base:#x}+{len:#x} overlaps a device already on the bus")]
    Overlap {
        /// Start of the rejected range.
        base: u64,
        /// Its length.
        len: u64,
    },
    /// A zero-length range.
    #[error("a device range cannot be empty")]
    EmptyRange,
}

#[derive(Clone)]
struct Range {
    base: u64,
    len: u64,
    device: SharedDevice,
}

/// Non-overlapping ranges, sorted by base.
#[derive(Clone, Default)]
pub struct Bus {
    ranges: Vec<Range>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.ranges.iter().map(|r| (r.base, r.len)))
            .finish()
    }
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts `device` at `[base, base + len)`.
    pub fn insert(&mut self, base: u64, len: u64, device: SharedDevice) -> Result<(), BusError> {
        if len == 0 {
            return Err(BusError::EmptyRange);
        }
        let end = base
            .checked_add(len)
            .ok_or(BusError::Overlap { base, len })?;
        if self
            .ranges
            .iter()
            .any(|r| base < r.base + r.len && r.base < end)
        {
            return Err(BusError::Overlap { base, len });
        }
        let at = self.ranges.partition_point(|r| r.base < base);
        self.ranges.insert(at, Range { base, len, device });
        Ok(())
    }

    /// The device covering `addr` and `addr`'s offset in it.
    fn find(&self, addr: u64) -> Option<(&SharedDevice, u64)> {
        let idx = self
            .ranges
            .partition_point(|r| r.base <= addr)
            .checked_sub(1)?;
        let r = &self.ranges[idx];
        (addr - r.base < r.len).then(|| (&r.device, addr - r.base))
    }

    /// Dispatches a read; false when no device covers `addr`.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((dev, offset)) => {
                lock(dev).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches a write; None when no device covers `addr`.
    pub fn write(&self, addr: u64, data: &[u8]) -> Option<DeviceAction> {
        self.find(addr)
            .map(|(dev, offset)| lock(dev).write(offset, data))
    }
}

/// Locks a device, recovering from a panic on another vCPU thread: device
/// state stays usable and the VM can still be torn down.
fn lock(dev: &SharedDevice) -> std::sync::MutexGuard<'_, dyn BusDevice + 'static> {
    dev.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        writes: Vec<(u64, Vec<u8>)>,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) -> DeviceAction {
            self.writes.push((offset, data.to_vec()));
            DeviceAction::None
        }
    }

    #[test]
    fn dispatches_by_range_with_offsets() {
        let mut bus = Bus::new();
        let a = Arc::new(Mutex::new(Recorder::default()));
        let b = Arc::new(Mutex::new(Recorder::default()));
        bus.insert(0x3f8, 8, a.clone()).unwrap();
        bus.insert(0x60, 5, b.clone()).unwrap();
        let mut data = [0u8; 1];
        assert!(bus.read(0x3fd, &mut data));
        assert_eq!(data, [5]);
        assert_eq!(bus.write(0x64, &[0xfe]), Some(DeviceAction::None));
        assert_eq!(b.lock().unwrap().writes, vec![(4, vec![0xfe])]);
        assert!(!bus.read(0x400, &mut data));
        assert!(!bus.read(0x5f, &mut data));
        assert_eq!(bus.write(0x65, &[0]), None);
    }

    #[test]
    fn rejects_overlaps_and_empty_ranges() {
        let mut bus = Bus::new();
        let d = Arc::new(Mutex::new(Recorder::default()));
        bus.insert(0x10, 0x10, d.clone()).unwrap();
        assert!(matches!(
            bus.insert(0x1f, 1, d.clone()),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(0x8, 0x9, d.clone()),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(0x0, 0, d.clone()),
            Err(BusError::EmptyRange)
        ));
        assert!(matches!(
            bus.insert(u64::MAX, 2, d.clone()),
            Err(BusError::Overlap { .. })
        ));
        bus.insert(0x20, 1, d).unwrap();
    }
}
