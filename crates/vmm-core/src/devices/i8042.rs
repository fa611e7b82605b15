//! Just enough of the i8042 keyboard controller for a guest to reboot:
//! the "pulse reset line" command (0xfe to port 0x64) ends the VM.

use super::bus::{BusDevice, DeviceAction};

/// First port of the controller (data port 0x60; command/status is 0x64).
pub const I8042_PORT_BASE: u64 = 0x60;
/// Ports covered: 0x60..=0x64.
pub const I8042_PORT_LEN: u64 = 5;
const COMMAND_OFFSET: u64 = 4;
const CMD_PULSE_RESET: u8 = 0xfe;

/// The controller. Reads return 0: an idle controller with empty buffers
/// (0xff would make the kernel's reboot path spin for seconds).
#[derive(Debug, Default)]
pub struct I8042;

impl BusDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> DeviceAction {
        if offset == COMMAND_OFFSET && data.first() == Some(&CMD_PULSE_RESET) {
            DeviceAction::Reset
        } else {
            DeviceAction::None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_command_resets() {
        let mut dev = I8042;
        assert_eq!(dev.write(4, &[0xfe]), DeviceAction::Reset);
        assert_eq!(dev.write(4, &[0xd1]), DeviceAction::None);
        assert_eq!(dev.write(0, &[0xfe]), DeviceAction::None);
        let mut status = [0xaa];
        dev.read(4, &mut status);
        assert_eq!(status, [0]);
    }
}
