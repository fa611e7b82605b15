//! microagent's virtual machine monitor: a KVM VM with guest memory, vCPU
//! threads, direct 64-bit Linux boot and the few legacy devices a 6.1 kernel
//! needs. No async runtime: vCPUs are threads, devices are called from them.
//!
//! Entry points: [`host::probe`] to learn what the host's KVM can do,
//! [`machine::Machine`] to build and run a Linux guest, [`tiny::TinyGuest`]
//! for hand-assembled test guests.

#![warn(missing_docs)]

pub mod arch;
pub mod devices;
pub mod disk_copy;
pub mod exit;
pub mod host;
pub mod kernel;
pub mod layout;
pub mod machine;
pub mod memory;
pub mod seccomp;
pub mod snapshot;
pub mod spawn;
pub mod stats;
pub mod tiny;
pub mod vcpu;
pub mod vm;
pub mod xstate_switch;

pub use arch::cpuid::CpuTemplate;
pub use exit::StopReason;
pub use host::{HostProfile, KernelVariant, KvmMode};
pub use machine::{Machine, MachineConfig, RunOutcome};
