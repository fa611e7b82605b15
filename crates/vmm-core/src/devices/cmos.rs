//! A read-only MC146818 CMOS RTC at ports 0x70/0x71: the wall clock in
//! binary 24-hour mode, never "update in progress", so a kernel that reads
//! it (no kvm-clock) neither spins nor gets garbage.

use std::time::{SystemTime, UNIX_EPOCH};

use super::bus::{BusDevice, DeviceAction};

/// Index port; data is at the next port.
pub const CMOS_PORT_BASE: u64 = 0x70;
/// Ports covered: 0x70 and 0x71.
pub const CMOS_PORT_LEN: u64 = 2;

const REG_SECONDS: u8 = 0x00;
const REG_MINUTES: u8 = 0x02;
const REG_HOURS: u8 = 0x04;
const REG_WEEKDAY: u8 = 0x06;
const REG_DAY: u8 = 0x07;
const REG_MONTH: u8 = 0x08;
const REG_YEAR: u8 = 0x09;
const REG_A: u8 = 0x0a;
const REG_B: u8 = 0x0b;
const REG_D: u8 = 0x0d;
const REG_CENTURY: u8 = 0x32;
/// Divider bits of a running 32.768 kHz clock, UIP clear.
const REG_A_VALUE: u8 = 0x26;
/// 24-hour, binary (not BCD) values.
const REG_B_VALUE: u8 = 0x02 | 0x04;
/// "Valid RAM and time".
const REG_D_VALUE: u8 = 0x80;

/// The device: the selected register index, and where "now" comes from.
#[derive(Debug)]
pub struct Cmos {
    index: u8,
    now: fn() -> u64,
}

impl Default for Cmos {
    fn default() -> Self {
        Self::with_clock(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        })
    }
}

/// (year, month, day) of a day count since 1970-01-01, proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl Cmos {
    /// A CMOS whose clock reads `now()` seconds since the Unix epoch.
    pub fn with_clock(now: fn() -> u64) -> Self {
        Self { index: 0, now }
    }

    /// The selected register (the device's only state; the clock is the
    /// host's).
    pub fn selected(&self) -> u8 {
        self.index
    }

    /// Selects register `index`, as a restored machine had it.
    pub fn select(&mut self, index: u8) {
        self.index = index & 0x7f;
    }

    fn register(&self, index: u8) -> u8 {
        let secs = (self.now)();
        let days = (secs / 86_400) as i64;
        let time = secs % 86_400;
        let (year, month, day) = civil_from_days(days);
        match index {
            REG_SECONDS => (time % 60) as u8,
            REG_MINUTES => (time / 60 % 60) as u8,
            REG_HOURS => (time / 3600) as u8,
            // 1970-01-01 was a Thursday; the RTC counts Sunday as 1.
            REG_WEEKDAY => ((days + 4).rem_euclid(7) + 1) as u8,
            REG_DAY => day as u8,
            REG_MONTH => month as u8,
            REG_YEAR => year.rem_euclid(100) as u8,
            REG_CENTURY => (year / 100) as u8,
            REG_A => REG_A_VALUE,
            REG_B => REG_B_VALUE,
            REG_D => REG_D_VALUE,
            _ => 0,
        }
    }
}

impl BusDevice for Cmos {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = if offset == 1 {
            self.register(self.index)
        } else {
            self.index
        };
        data.fill(value);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> DeviceAction {
        if offset == 0 {
            // Bit 7 of the index port is the NMI mask, not part of the index.
            self.index = data.first().copied().unwrap_or(0) & 0x7f;
        }
        DeviceAction::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_reg(cmos: &mut Cmos, reg: u8) -> u8 {
        cmos.write(0, &[reg | 0x80]);
        let mut b = [0];
        cmos.read(1, &mut b);
        b[0]
    }

    #[test]
    fn reports_a_known_time() {
        // 2026-11-22 12:34:56 UTC, a Sunday.
        let mut cmos = Cmos::with_clock(|| 1_795_350_896);
        assert_eq!(read_reg(&mut cmos, REG_SECONDS), 56);
        assert_eq!(read_reg(&mut cmos, REG_MINUTES), 34);
        assert_eq!(read_reg(&mut cmos, REG_HOURS), 12);
        assert_eq!(read_reg(&mut cmos, REG_DAY), 22);
        assert_eq!(read_reg(&mut cmos, REG_MONTH), 11);
        assert_eq!(read_reg(&mut cmos, REG_YEAR), 26);
        assert_eq!(read_reg(&mut cmos, REG_CENTURY), 20);
        assert_eq!(read_reg(&mut cmos, REG_WEEKDAY), 1);
        assert_eq!(
            read_reg(&mut cmos, REG_A) & 0x80,
            0,
            "never update-in-progress"
        );
        assert_eq!(read_reg(&mut cmos, REG_B), REG_B_VALUE);
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }
}
