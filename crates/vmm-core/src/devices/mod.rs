//! Emulated devices and the buses that route guest accesses to them.

pub mod bus;
pub mod cmos;
pub mod event_loop;
pub mod i8042;
pub mod serial;
pub mod virtio;

pub use bus::{Bus, BusDevice, BusError, DeviceAction, SharedDevice};
