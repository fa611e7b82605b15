//! What a vCPU exit means for the VM, decided without touching KVM so it can
//! be unit-tested with hand-made exits.

use kvm_ioctls::VcpuExit;

use crate::devices::{Bus, DeviceAction};

/// KVM_SYSTEM_EVENT_* types.
const SYSTEM_EVENT_SHUTDOWN: u32 = 1;
const SYSTEM_EVENT_RESET: u32 = 2;

/// The buses a vCPU dispatches to.
#[derive(Clone, Debug, Default)]
pub struct Buses {
    /// x86 port I/O.
    pub pio: Bus,
    /// Memory-mapped I/O.
    pub mmio: Bus,
}

/// How the VM ended, or why a vCPU cannot go on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The guest asked for a reset (reboot): a clean end.
    Reset,
    /// The guest powered off: a clean end.
    PowerOff,
    /// A vCPU halted with no interrupt controller to wake it (probe guests).
    Halted,
    /// The guest triple-faulted.
    TripleFault,
    /// The owner's time limit passed first.
    TimedOut,
    /// The owner stopped the VM through its [`crate::machine::MachineHandle`]
    /// (a teardown: the guest was not asked).
    Stopped,
    /// KVM could not enter or run the guest.
    KvmFailure(String),
}

impl StopReason {
    /// True for the ends a guest asks for itself.
    pub fn is_clean(&self) -> bool {
        matches!(
            self,
            StopReason::Reset | StopReason::PowerOff | StopReason::Halted
        )
    }
}

/// What the vCPU loop does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitAction {
    /// Enter the guest again.
    Continue,
    /// Stop the whole VM.
    Stop(StopReason),
}

fn device_action(action: DeviceAction) -> ExitAction {
    match action {
        DeviceAction::None => ExitAction::Continue,
        DeviceAction::Reset => ExitAction::Stop(StopReason::Reset),
    }
}

/// Decides what an exit means, dispatching I/O to `buses`. Accesses no device
/// claims read as all ones (a floating bus) and writes to them are dropped.
pub fn handle_exit(exit: VcpuExit<'_>, buses: &Buses) -> ExitAction {
    match exit {
        VcpuExit::IoIn(port, data) => {
            if !buses.pio.read(u64::from(port), data) {
                tracing::trace!(port = format_args!("{port:#x}"), "read from unclaimed port");
                data.fill(0xff);
            }
            ExitAction::Continue
        }
        VcpuExit::IoOut(port, data) => match buses.pio.write(u64::from(port), data) {
            Some(action) => device_action(action),
            None => {
                tracing::trace!(port = format_args!("{port:#x}"), ?data, "write to unclaimed port");
                ExitAction::Continue
            }
        },
        VcpuExit::MmioRead(addr, data) => {
            if !buses.mmio.read(addr, data) {
                tracing::debug!(addr = format_args!("{addr:#x}"), "read from unclaimed MMIO");
                data.fill(0xff);
            }
            ExitAction::Continue
        }
        VcpuExit::MmioWrite(addr, data) => match buses.mmio.write(addr, data) {
            Some(action) => device_action(action),
            None => {
                tracing::debug!(addr = format_args!("{addr:#x}"), "write to unclaimed MMIO");
                ExitAction::Continue
            }
        },
        VcpuExit::Hlt => ExitAction::Stop(StopReason::Halted),
        VcpuExit::Shutdown => ExitAction::Stop(StopReason::TripleFault),
        VcpuExit::SystemEvent(SYSTEM_EVENT_SHUTDOWN, _) => ExitAction::Stop(StopReason::PowerOff),
        VcpuExit::SystemEvent(SYSTEM_EVENT_RESET, _) => ExitAction::Stop(StopReason::Reset),
        VcpuExit::FailEntry(reason, cpu) => ExitAction::Stop(StopReason::KvmFailure(format!(
            "KVM could not enter the guest (hardware entry failure reason {reason:#x} on host CPU {cpu})"
        ))),
        VcpuExit::InternalError => ExitAction::Stop(StopReason::KvmFailure(
            "KVM internal error (on an emulating host this is usually an instruction its emulator cannot run)".into(),
        )),
        other => ExitAction::Stop(StopReason::KvmFailure(format!("unexpected vCPU exit {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::i8042::{I8042, I8042_PORT_BASE, I8042_PORT_LEN};
    use std::sync::{Arc, Mutex};

    fn buses() -> Buses {
        let mut b = Buses::default();
        b.pio
            .insert(I8042_PORT_BASE, I8042_PORT_LEN, Arc::new(Mutex::new(I8042)))
            .unwrap();
        b
    }

    #[test]
    fn i8042_reset_stops_the_vm_cleanly() {
        let action = handle_exit(VcpuExit::IoOut(0x64, &[0xfe]), &buses());
        assert_eq!(action, ExitAction::Stop(StopReason::Reset));
        assert!(StopReason::Reset.is_clean());
    }

    #[test]
    fn unclaimed_io_reads_all_ones_and_continues() {
        let b = buses();
        let mut data = [0u8; 2];
        assert_eq!(
            handle_exit(VcpuExit::IoIn(0x2f8, &mut data), &b),
            ExitAction::Continue
        );
        assert_eq!(data, [0xff, 0xff]);
        assert_eq!(
            handle_exit(VcpuExit::IoOut(0x80, &[1]), &b),
            ExitAction::Continue
        );
        let mut mmio = [0u8; 4];
        assert_eq!(
            handle_exit(VcpuExit::MmioRead(0xd000_0000, &mut mmio), &b),
            ExitAction::Continue
        );
        assert_eq!(mmio, [0xff; 4]);
        assert_eq!(
            handle_exit(VcpuExit::MmioWrite(0xd000_0000, &[1]), &b),
            ExitAction::Continue
        );
    }

    #[test]
    fn claimed_io_reaches_the_device() {
        let mut data = [0xaa];
        assert_eq!(
            handle_exit(VcpuExit::IoIn(0x64, &mut data), &buses()),
            ExitAction::Continue
        );
        assert_eq!(data, [0]);
    }

    #[test]
    fn fatal_exits_stop_with_a_reason() {
        let b = buses();
        assert_eq!(
            handle_exit(VcpuExit::Shutdown, &b),
            ExitAction::Stop(StopReason::TripleFault)
        );
        assert_eq!(
            handle_exit(VcpuExit::Hlt, &b),
            ExitAction::Stop(StopReason::Halted)
        );
        assert_eq!(
            handle_exit(VcpuExit::SystemEvent(1, &[]), &b),
            ExitAction::Stop(StopReason::PowerOff)
        );
        assert_eq!(
            handle_exit(VcpuExit::SystemEvent(2, &[]), &b),
            ExitAction::Stop(StopReason::Reset)
        );
        for exit in [
            VcpuExit::InternalError,
            VcpuExit::FailEntry(7, 1),
            VcpuExit::Unknown,
        ] {
            match handle_exit(exit, &b) {
                ExitAction::Stop(r @ StopReason::KvmFailure(_)) => assert!(!r.is_clean()),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}
