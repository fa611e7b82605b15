//! The guest's extended FPU state (AVX's YMM upper halves, AVX-512's
//! opmask and ZMM registers), saved and loaded per task on the compat guest
//! kernel's request (issue 10, docs/host-compat.md).
//!
//! On hosts that emulate guest kernel mode, guest user mode runs natively
//! with the host's XCR0 and CPUID, so guest processes use AVX and AVX-512
//! (glibc's string functions use ymm16-31 on AVX-512 hosts). The compat
//! kernel (`noxsave`) switches only the FXSAVE state (x87, xmm0-15) between
//! processes, and the host's instruction emulator can run neither XSAVE nor
//! VEX/EVEX instructions at CPL0, so the kernel cannot switch the rest
//! itself. It asks us: after each FXSAVE it writes the guest-physical
//! address of the task's area, shifted right by 6, to [`SAVE_PORT`], and
//! after each FXRSTOR to [`LOAD_PORT`]. The area is the vCPU's XSAVE state
//! (standard format) from its header on: we copy it out verbatim, and back
//! in with the legacy part and its XSTATE_BV bits left as FXRSTOR set them.

use kvm_bindings::kvm_xsave;
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress};

use crate::memory::GuestMemory;

/// Port the guest writes to after saving a task's FPU state.
pub const SAVE_PORT: u16 = 0xae0;
/// Port the guest writes to after loading a task's FPU state.
pub const LOAD_PORT: u16 = 0xae4;
/// The compat kernel's command-line switch that makes it use the ports.
pub const CMDLINE_SWITCH: &str = "microagent_xstate";
/// Bytes of the legacy region (x87, SSE) that FXSAVE/FXRSTOR handle.
const LEGACY_BYTES: usize = 512;
/// Bytes of a task's area: the rest of `kvm_xsave`'s 4 KiB, header first
/// (the compat kernel reserves as many per task).
pub const AREA_BYTES: usize = 4096 - LEGACY_BYTES;
/// The area's address is given in units of this many bytes (its alignment).
const AREA_ADDRESS_SHIFT: u32 = 6;
/// XSTATE_BV bits of the legacy components (x87, SSE).
const LEGACY_FEATURES: u64 = 0b11;

/// Why a request could not be served.
#[derive(Debug, thiserror::Error)]
pub enum XstateSwitchError {
    /// KVM_GET_XSAVE or KVM_SET_XSAVE failed.
    #[error("could not {action} the XSAVE state of the vCPU")]
    Xsave {
        /// "read" or "write".
        action: &'static str,
        /// What KVM said.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The guest named an area outside its memory.
    #[error("the guest named FPU state area {0:#x}, outside its memory")]
    Area(u64, #[source] vm_memory::GuestMemoryError),
}

/// Which way a request copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the vCPU to guest memory.
    Save,
    /// From guest memory to the vCPU.
    Load,
}

/// One guest request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchRequest {
    /// Which way.
    pub direction: Direction,
    /// The task's area.
    pub area: GuestAddress,
}

impl SwitchRequest {
    /// The request a port write makes, or None when the write is not one.
    pub fn decode(port: u16, data: &[u8]) -> Option<SwitchRequest> {
        let direction = match port {
            SAVE_PORT => Direction::Save,
            LOAD_PORT => Direction::Load,
            _ => return None,
        };
        let value: [u8; 4] = data.try_into().ok()?;
        let area = u64::from(u32::from_le_bytes(value)) << AREA_ADDRESS_SHIFT;
        Some(SwitchRequest {
            direction,
            area: GuestAddress(area),
        })
    }
}

/// The serving side, one per machine whose kernel uses the ports.
#[derive(Clone, Debug)]
pub struct XstateSwitch {
    mem: GuestMemory,
}

impl XstateSwitch {
    /// Serves requests against `mem`, or None where the host's guest XSAVE
    /// area (`xsave_size`, from KVM_CAP_XSAVE2; 0 when unknown) does not fit
    /// `kvm_xsave`: KVM_SET_XSAVE would read past it.
    pub fn new(mem: GuestMemory, xsave_size: usize) -> Option<Self> {
        (xsave_size <= std::mem::size_of::<kvm_xsave>()).then_some(Self { mem })
    }

    /// Copies the extended state as `request` asks.
    pub fn serve(&self, fd: &VcpuFd, request: SwitchRequest) -> Result<(), XstateSwitchError> {
        let get = |source| XstateSwitchError::Xsave {
            action: "read",
            source,
        };
        match request.direction {
            Direction::Save => {
                let xsave = fd.get_xsave().map_err(get)?;
                self.mem
                    .write_slice(&extended_state(&xsave), request.area)
                    .map_err(|e| XstateSwitchError::Area(request.area.0, e))
            }
            Direction::Load => {
                let mut area = [0u8; AREA_BYTES];
                self.mem
                    .read_slice(&mut area, request.area)
                    .map_err(|e| XstateSwitchError::Area(request.area.0, e))?;
                let mut xsave = fd.get_xsave().map_err(get)?;
                set_extended_state(&mut xsave, &area);
                // SAFETY: XstateSwitch::new made sure the host's XSAVE area
                // fits kvm_xsave, so KVM reads only within it. KVM checks the
                // header the guest supplied (unknown components: EINVAL).
                unsafe { fd.set_xsave(&xsave) }.map_err(|source| XstateSwitchError::Xsave {
                    action: "write",
                    source,
                })
            }
        }
    }
}

/// The XSAVE state from its header on, as it is (components whose
/// XSTATE_BV bit is clear are in their initial state whatever the bytes).
pub fn extended_state(xsave: &kvm_xsave) -> [u8; AREA_BYTES] {
    let mut out = [0u8; AREA_BYTES];
    for (chunk, word) in out
        .chunks_exact_mut(4)
        .zip(&xsave.region[LEGACY_BYTES / 4..])
    {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    out
}

/// Puts `area` into `xsave` from the header on, keeping the legacy region
/// and the legacy components' XSTATE_BV bits of `xsave`.
pub fn set_extended_state(xsave: &mut kvm_xsave, area: &[u8; AREA_BYTES]) {
    let legacy_bv = xstate_bv_of(&extended_state(xsave)) & LEGACY_FEATURES;
    for (word, chunk) in xsave.region[LEGACY_BYTES / 4..]
        .iter_mut()
        .zip(area.chunks_exact(4))
    {
        *word = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    let bv = (xstate_bv_of(area) & !LEGACY_FEATURES) | legacy_bv;
    xsave.region[LEGACY_BYTES / 4] = bv as u32;
    xsave.region[LEGACY_BYTES / 4 + 1] = (bv >> 32) as u32;
}

/// XSTATE_BV: the first 8 bytes of the header.
fn xstate_bv_of(area: &[u8; AREA_BYTES]) -> u64 {
    let mut bv = [0u8; 8];
    bv.copy_from_slice(&area[..8]);
    u64::from_le_bytes(bv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_only_four_byte_writes_to_its_ports() {
        let r = SwitchRequest::decode(SAVE_PORT, &0x1234u32.to_le_bytes()).unwrap();
        assert_eq!(r.direction, Direction::Save);
        assert_eq!(r.area, GuestAddress(0x1234 << 6));
        let r = SwitchRequest::decode(LOAD_PORT, &u32::MAX.to_le_bytes()).unwrap();
        assert_eq!(r.direction, Direction::Load);
        assert_eq!(r.area, GuestAddress(u64::from(u32::MAX) << 6));
        assert_eq!(SwitchRequest::decode(0x3f8, &[0; 4]), None);
        assert_eq!(SwitchRequest::decode(SAVE_PORT, &[1]), None);
        assert_eq!(SwitchRequest::decode(LOAD_PORT, &[0; 2]), None);
    }

    #[test]
    fn extended_state_round_trips_past_the_legacy_region() {
        let mut xsave = kvm_xsave::default();
        // FXRSTOR's work: the legacy region and x87|SSE in XSTATE_BV.
        xsave.region[..LEGACY_BYTES / 4].fill(0x1111_1111);
        xsave.region[LEGACY_BYTES / 4] = 0b11;
        let mut area = [0u8; AREA_BYTES];
        for (i, b) in area.iter_mut().enumerate() {
            *b = i as u8 ^ 0x5a;
        }
        // AVX and the three AVX-512 components, and a stray SSE bit clear.
        area[..8].copy_from_slice(&0xe4u64.to_le_bytes());
        set_extended_state(&mut xsave, &area);
        assert_eq!(xsave.region[..LEGACY_BYTES / 4], [0x1111_1111; 128]);
        let back = extended_state(&xsave);
        assert_eq!(xstate_bv_of(&back), 0xe7, "legacy bits kept, ours taken");
        assert_eq!(back[8..], area[8..]);
    }

    #[test]
    fn a_zeroed_area_loads_every_extended_component_as_initial() {
        let mut xsave = kvm_xsave::default();
        xsave.region[LEGACY_BYTES / 4] = 0xe7;
        xsave.region[LEGACY_BYTES / 4 + 100] = 0xdead_beef;
        set_extended_state(&mut xsave, &[0; AREA_BYTES]);
        assert_eq!(xsave.region[LEGACY_BYTES / 4], 0b11);
        assert_eq!(xsave.region[LEGACY_BYTES / 4 + 100], 0);
    }
}
