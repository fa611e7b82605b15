//! COM1: a 16550A UART (vm-superio) whose interrupt is an irqfd and whose
//! output goes to a console sink (file and/or stdout).

use std::io::{self, Write};

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
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
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
}
