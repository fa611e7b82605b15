//! COM1: a 16550A UART (vm-superio) whose interrupt is an irqfd and whose
//! output goes to a console sink (file and/or stdout).

use std::io::{self, Write};

use serde::{Deserialize, Serialize};
use vm_superio::serial::SerialState;
use vm_superio::{Serial as Uart, Trigger};
use vmm_sys_util::eventfd::EventFd;

use super::bus::{BusDevice, DeviceAction};

/// I/O port base of COM1.
pub const COM1_PORT_BASE: u64 = 0x3f8;
/// Ports covered by a UART.
pub const COM_PORT_LEN: u64 = 8;

/// Raises the serial IRQ by signalling an eventfd registered as an irqfd.
#[derive(Debug)]
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Where console bytes go: any number of writers, each flushed per write
/// so a crash loses nothing the guest printed.
#[derive(Default)]
pub struct ConsoleSink {
    writers: Vec<Box<dyn Write + Send>>,
}

impl std::fmt::Debug for ConsoleSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConsoleSink({} writers)", self.writers.len())
    }
}

impl ConsoleSink {
    /// A sink that drops everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a writer.
    pub fn with(mut self, writer: Box<dyn Write + Send>) -> Self {
        self.writers.push(writer);
        self
    }
}

impl Write for ConsoleSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // A failing writer (closed stdout, full disk) must not stop the
        // guest or the others: drop it and carry on.
        self.writers
            .retain_mut(|w| w.write_all(buf).and_then(|()| w.flush()).is_ok());
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The UART as a bus device.
pub struct Serial {
    uart: Uart<IrqTrigger, vm_superio::serial::NoEvents, ConsoleSink>,
}

impl std::fmt::Debug for Serial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Serial")
    }
}

impl Serial {
    /// A UART raising `irq` and writing to `sink`.
    pub fn new(irq: EventFd, sink: ConsoleSink) -> Self {
        Self {
            uart: Uart::new(IrqTrigger(irq), sink),
        }
    }
}

/// The UART's registers and receive FIFO, as a snapshot holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // the 16550A's registers, named as vm-superio names them
pub struct SerialRegs {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

/// A saved UART state the device cannot take.
#[derive(Debug, thiserror::Error)]
#[error("the saved serial state is invalid (receive FIFO of {0} bytes)")]
pub struct SerialStateError(usize);

impl Serial {
    /// The UART's state.
    pub fn save_state(&self) -> SerialRegs {
        let s = self.uart.state();
        SerialRegs {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// COM1 in the saved state `regs`, raising `irq`, writing to `sink`.
    pub fn from_state(
        regs: &SerialRegs,
        irq: EventFd,
        sink: ConsoleSink,
    ) -> Result<Self, SerialStateError> {
        let state = SerialState {
            baud_divisor_low: regs.baud_divisor_low,
            baud_divisor_high: regs.baud_divisor_high,
            interrupt_enable: regs.interrupt_enable,
            interrupt_identification: regs.interrupt_identification,
            line_control: regs.line_control,
            line_status: regs.line_status,
            modem_control: regs.modem_control,
            modem_status: regs.modem_status,
            scratch: regs.scratch,
            in_buffer: regs.in_buffer.clone(),
        };
        let uart = Uart::from_state(&state, IrqTrigger(irq), vm_superio::serial::NoEvents, sink)
            .map_err(|_| SerialStateError(regs.in_buffer.len()))?;
        Ok(Self { uart })
    }
}

impl BusDevice for Serial {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = self.uart.read(offset as u8);
        data.fill(value);
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> DeviceAction {
        if let Some(&value) = data.first() {
            if let Err(e) = self.uart.write(offset as u8, value) {
                tracing::warn!("serial write failed: {e:?}");
            }
        }
        DeviceAction::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct Broken;
    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("gone"))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn transmitted_bytes_reach_every_writer_and_raise_the_irq() {
        let out = Shared::default();
        let irq = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap();
        let sink = ConsoleSink::new()
            .with(Box::new(Broken))
            .with(Box::new(out.clone()));
        let mut serial = Serial::new(irq.try_clone().unwrap(), sink);
        // Enable the "transmitter holding register empty" interrupt.
        serial.write(1, &[0x02]);
        for b in b"hi\n" {
            serial.write(0, &[*b]);
        }
        assert_eq!(&*out.0.lock().unwrap(), b"hi\n");
        assert!(irq.read().unwrap() >= 1);
        // Line status: transmitter empty.
        let mut lsr = [0];
        serial.read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0);
    }

    #[test]
    fn state_round_trips() {
        let irq = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap();
        let mut serial = Serial::new(irq.try_clone().unwrap(), ConsoleSink::new());
        serial.write(3, &[0x83]); // DLAB on
        serial.write(0, &[0x0c]); // divisor low
        serial.write(3, &[0x03]);
        serial.write(7, &[0x5a]); // scratch
        let regs = serial.save_state();
        assert_eq!(regs.baud_divisor_low, 0x0c);
        let back = Serial::from_state(&regs, irq, ConsoleSink::new()).unwrap();
        assert_eq!(back.save_state(), regs);
        let mut too_full = regs;
        too_full.in_buffer = vec![0; 4096];
        let irq = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap();
        assert!(Serial::from_state(&too_full, irq, ConsoleSink::new()).is_err());
    }
}
