//! What kind of KVM this host has. On a nested, pagetable-based KVM (PVM)
//! guest kernel mode is emulated, ~2,000x slower than native, and the
//! emulator lacks some instructions: such a host needs the `compat` CPUID
//! template, extra kernel command-line options and the compat kernel.

use std::time::Duration;

use crate::arch::cpuid::CpuTemplate;
use crate::exit::StopReason;
use crate::tiny::{asm, TinyGuest, TinyGuestError};

/// Iterations of the ring-0 timing loop: ~0.1 ms natively, ~0.1 s emulated.
pub const PROBE_ITERATIONS: u32 = 100_000;
/// Per-iteration time above which guest kernel mode counts as emulated.
/// Native hardware runs the loop at well under 1 ns per iteration; the
/// emulating hosts we know take over 1,000 ns.
pub const EMULATED_THRESHOLD_NS: f64 = 50.0;

/// Kernel command-line options an emulating host needs (HOST-NOTES): no
/// XSAVE family, no SMAP (CLAC/STAC) or POPCNT, no slow write-protect pass,
/// and the extended FPU state (AVX, AVX-512) switched through the VMM ([`crate::xstate_switch`]).
pub const COMPAT_CMDLINE: &str = "noxsave clearcpuid=smap,popcnt rodata=off microagent_xstate ";

/// Which guest kernel a host boots: the unpatched `standard` one, or the
/// `compat` one with our patches for hosts that emulate guest kernel mode.
/// Chosen by [`HostProfile::kernel_variant`]; `cargo xtask` builds both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelVariant {
    /// Unpatched: for hosts with hardware virtualization.
    Standard,
    /// With the compat patches (docs/host-compat.md).
    Compat,
}

impl KernelVariant {
    /// Every variant.
    pub const ALL: [KernelVariant; 2] = [KernelVariant::Standard, KernelVariant::Compat];

    /// The stable name (`standard`, `compat`).
    pub fn name(self) -> &'static str {
        match self {
            KernelVariant::Standard => "standard",
            KernelVariant::Compat => "compat",
        }
    }

    /// Parses a stable name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.name() == name)
    }

    /// The file name of its kernel in an asset directory (`vmlinux-compat`).
    pub fn vmlinux_file(self) -> String {
        format!("vmlinux-{}", self.name())
    }

    /// The CPUID template guests of this kernel run with.
    pub fn cpu_template(self) -> CpuTemplate {
        match self {
            KernelVariant::Standard => CpuTemplate::Standard,
            KernelVariant::Compat => CpuTemplate::Compat,
        }
    }
}

impl std::fmt::Display for KernelVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How the host's KVM runs guest kernel code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvmMode {
    /// Hardware virtualization: guest kernel code runs natively.
    Native,
    /// Guest kernel mode is emulated instruction by instruction.
    Emulated,
}

impl KvmMode {
    /// Stable lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            KvmMode::Native => "native",
            KvmMode::Emulated => "emulated",
        }
    }
}

/// Why the host could not be probed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The probe guest could not run at all.
    #[error("the ring-0 probe guest could not run")]
    ProbeGuest(#[from] TinyGuestError),
    /// The probe guest ran but did not end in HLT.
    #[error("the ring-0 probe guest ended unexpectedly: {0:?}")]
    ProbeOutcome(StopReason),
}

/// The measured facts about this host that shape how guests are run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostProfile {
    /// Native or emulated guest kernel mode.
    pub mode: KvmMode,
    /// Measured cost of one ring-0 loop iteration, in nanoseconds.
    pub ring0_ns_per_iteration: f64,
    /// Wall time of the probe's guest run.
    pub probe_time: Duration,
}

impl HostProfile {
    /// Classifies a measured loop.
    pub fn from_measurement(elapsed: Duration, iterations: u32) -> Self {
        let ns = elapsed.as_nanos() as f64 / f64::from(iterations.max(1));
        let mode = if ns > EMULATED_THRESHOLD_NS {
            KvmMode::Emulated
        } else {
            KvmMode::Native
        };
        Self {
            mode,
            ring0_ns_per_iteration: ns,
            probe_time: elapsed,
        }
    }

    /// The CPUID template guests get here.
    pub fn cpu_template(&self) -> CpuTemplate {
        match self.mode {
            KvmMode::Native => CpuTemplate::Standard,
            KvmMode::Emulated => CpuTemplate::Compat,
        }
    }

    /// The guest kernel variant that boots here.
    pub fn kernel_variant(&self) -> KernelVariant {
        match self.mode {
            KvmMode::Native => KernelVariant::Standard,
            KvmMode::Emulated => KernelVariant::Compat,
        }
    }

    /// Roughly how much slower than native guest kernel code runs here.
    pub fn slowdown_vs_native(&self) -> f64 {
        // A native `dec; jnz` iteration takes about 0.3 ns (one cycle at ~3 GHz).
        (self.ring0_ns_per_iteration / 0.3).max(1.0)
    }
}

/// Kernel command-line additions for guests run with `template`.
pub fn cmdline_additions(template: CpuTemplate) -> &'static str {
    match template {
        CpuTemplate::Standard => "",
        CpuTemplate::Compat => COMPAT_CMDLINE,
    }
}

/// Times a tiny ring-0 loop to tell native from emulated KVM (well under a
/// second either way).
pub fn probe() -> Result<HostProfile, HostError> {
    let mut code = asm::mov_ecx(PROBE_ITERATIONS);
    code.extend(asm::SPIN_ECX);
    code.push(asm::HLT);
    let run = TinyGuest::default().run(&code)?;
    if run.reason != StopReason::Halted {
        return Err(HostError::ProbeOutcome(run.reason));
    }
    Ok(HostProfile::from_measurement(run.elapsed, PROBE_ITERATIONS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_measurements() {
        let native = HostProfile::from_measurement(Duration::from_micros(300), PROBE_ITERATIONS);
        assert_eq!(native.mode, KvmMode::Native);
        assert_eq!(native.cpu_template(), CpuTemplate::Standard);
        assert_eq!(native.kernel_variant().name(), "standard");
        let emulated = HostProfile::from_measurement(Duration::from_millis(120), PROBE_ITERATIONS);
        assert_eq!(emulated.mode, KvmMode::Emulated);
        assert_eq!(emulated.kernel_variant().name(), "compat");
        assert_eq!(
            emulated.kernel_variant().cpu_template(),
            emulated.cpu_template()
        );
        assert!(emulated.slowdown_vs_native() > 1000.0);
    }

    #[test]
    fn kernel_variant_names_round_trip() {
        for v in KernelVariant::ALL {
            assert_eq!(KernelVariant::from_name(v.name()), Some(v));
        }
        assert_eq!(KernelVariant::from_name("fast"), None);
        assert_eq!(KernelVariant::Compat.vmlinux_file(), "vmlinux-compat");
    }

    #[test]
    fn compat_adds_the_emulator_workarounds() {
        assert_eq!(cmdline_additions(CpuTemplate::Standard), "");
        let extra = cmdline_additions(CpuTemplate::Compat);
        for opt in [
            "noxsave",
            "clearcpuid=smap,popcnt",
            crate::xstate_switch::CMDLINE_SWITCH,
        ] {
            assert!(extra.contains(opt));
        }
    }
}
