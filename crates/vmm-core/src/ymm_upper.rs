//! The upper halves of the guest's YMM registers, saved and loaded on the
//! compat guest kernel's request (issue 10, docs/host-compat.md).
//!
//! On hosts that emulate guest kernel mode, guest user mode runs natively
//! with the host's XCR0 and CPUID, so guest processes use AVX. The compat
//! kernel (`noxsave`) switches only the FXSAVE state between processes, and
//! the host's instruction emulator can run neither XSAVE nor VEX instructions
//! at CPL0, so the kernel cannot switch the upper halves itself. It asks us:
//! after each FXSAVE it writes the guest-physical address of the task's
//! 256-byte area, shifted right by 6, to [`SAVE_PORT`], and after each
//! FXRSTOR to [`LOAD_PORT`]. We copy the YMM_Hi128 component of the vCPU's
//! XSAVE state out to that area, or in from it.

use kvm_bindings::kvm_xsave;
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress};

use crate::memory::GuestMemory;

/// Port the guest writes to after saving a task's FPU state.
pub const SAVE_PORT: u16 = 0xae0;
/// Port the guest writes to after loading a task's FPU state.
pub const LOAD_PORT: u16 = 0xae4;
/// The compat kernel's command-line switch that makes it use the ports.
pub const CMDLINE_SWITCH: &str = "microagent_ymmh";
/// Bytes of the upper halves: 16 registers of 16 bytes.
pub const AREA_BYTES: usize = 256;
/// The area's address is given in units of this many bytes (its alignment).
const AREA_ADDRESS_SHIFT: u32 = 6;
/// Where XSTATE_BV sits in the standard XSAVE layout.
const XSTATE_BV_OFFSET: usize = 512;
/// Where the YMM_Hi128 component sits in the standard XSAVE layout.
const YMM_HI128_OFFSET: usize = 576;
/// The AVX (YMM_Hi128) state component bit.
const XFEATURE_YMM: u64 = 1 << 2;

/// Why a request could not be served.
#[derive(Debug, thiserror::Error)]
pub enum YmmUpperError {
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
    #[error("the guest named YMM area {0:#x}, outside its memory")]
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
pub struct Request {
    /// Which way.
    pub direction: Direction,
    /// The task's area.
    pub area: GuestAddress,
}

impl Request {
    /// The request a port write makes, or None when the write is not one.
    pub fn decode(port: u16, data: &[u8]) -> Option<Request> {
        let direction = match port {
            SAVE_PORT => Direction::Save,
            LOAD_PORT => Direction::Load,
            _ => return None,
        };
        let value: [u8; 4] = data.try_into().ok()?;
        let area = u64::from(u32::from_le_bytes(value)) << AREA_ADDRESS_SHIFT;
        Some(Request {
            direction,
            area: GuestAddress(area),
        })
    }
}

/// The serving side, one per machine whose kernel uses the ports.
#[derive(Clone, Debug)]
pub struct YmmUpper {
    mem: GuestMemory,
}

impl YmmUpper {
    /// Serves requests against `mem`, or None where the host's guest XSAVE
    /// area (`xsave_size`, from KVM_CAP_XSAVE2; 0 when unknown) does not fit
    /// `kvm_xsave`: KVM_SET_XSAVE would read past it.
    pub fn new(mem: GuestMemory, xsave_size: usize) -> Option<Self> {
        (xsave_size <= std::mem::size_of::<kvm_xsave>()).then_some(Self { mem })
    }

    /// Copies the upper halves as `request` asks.
    pub fn serve(&self, fd: &VcpuFd, request: Request) -> Result<(), YmmUpperError> {
        let get = |source| YmmUpperError::Xsave {
            action: "read",
            source,
        };
        match request.direction {
            Direction::Save => {
                let xsave = fd.get_xsave().map_err(get)?;
                self.mem
                    .write_slice(&upper_halves(&xsave), request.area)
                    .map_err(|e| YmmUpperError::Area(request.area.0, e))
            }
            Direction::Load => {
                let mut area = [0u8; AREA_BYTES];
                self.mem
                    .read_slice(&mut area, request.area)
                    .map_err(|e| YmmUpperError::Area(request.area.0, e))?;
                let mut xsave = fd.get_xsave().map_err(get)?;
                set_upper_halves(&mut xsave, &area);
                // SAFETY: YmmUpper::new made sure the host's XSAVE area fits
                // kvm_xsave, so KVM reads only within it.
                unsafe { fd.set_xsave(&xsave) }.map_err(|source| YmmUpperError::Xsave {
                    action: "write",
                    source,
                })
            }
        }
    }
}

fn byte_at(xsave: &kvm_xsave, offset: usize) -> u8 {
    xsave.region[offset / 4].to_le_bytes()[offset % 4]
}

fn set_byte_at(xsave: &mut kvm_xsave, offset: usize, value: u8) {
    let word = &mut xsave.region[offset / 4];
    let mut bytes = word.to_le_bytes();
    bytes[offset % 4] = value;
    *word = u32::from_le_bytes(bytes);
}

fn xstate_bv(xsave: &kvm_xsave) -> u64 {
    u64::from(xsave.region[XSTATE_BV_OFFSET / 4])
        | (u64::from(xsave.region[XSTATE_BV_OFFSET / 4 + 1]) << 32)
}

/// The YMM_Hi128 component of `xsave`: zeros when it is in its initial
/// state (XSTATE_BV says so; the bytes may then be stale).
pub fn upper_halves(xsave: &kvm_xsave) -> [u8; AREA_BYTES] {
    let mut out = [0u8; AREA_BYTES];
    if xstate_bv(xsave) & XFEATURE_YMM != 0 {
        for (i, b) in out.iter_mut().enumerate() {
            *b = byte_at(xsave, YMM_HI128_OFFSET + i);
        }
    }
    out
}

/// Puts `area` into `xsave` as its YMM_Hi128 component.
pub fn set_upper_halves(xsave: &mut kvm_xsave, area: &[u8; AREA_BYTES]) {
    for (i, b) in area.iter().enumerate() {
        set_byte_at(xsave, YMM_HI128_OFFSET + i, *b);
    }
    xsave.region[XSTATE_BV_OFFSET / 4] |= XFEATURE_YMM as u32;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_only_four_byte_writes_to_its_ports() {
        let r = Request::decode(SAVE_PORT, &0x1234u32.to_le_bytes()).unwrap();
        assert_eq!(r.direction, Direction::Save);
        assert_eq!(r.area, GuestAddress(0x1234 << 6));
        let r = Request::decode(LOAD_PORT, &u32::MAX.to_le_bytes()).unwrap();
        assert_eq!(r.direction, Direction::Load);
        assert_eq!(r.area, GuestAddress(u64::from(u32::MAX) << 6));
        assert_eq!(Request::decode(0x3f8, &[0; 4]), None);
        assert_eq!(Request::decode(SAVE_PORT, &[1]), None);
        assert_eq!(Request::decode(LOAD_PORT, &[0; 2]), None);
    }

    #[test]
    fn upper_halves_round_trip_and_mark_the_component() {
        let mut xsave = kvm_xsave::default();
        let mut area = [0u8; AREA_BYTES];
        for (i, b) in area.iter_mut().enumerate() {
            *b = i as u8 ^ 0x5a;
        }
        set_upper_halves(&mut xsave, &area);
        assert_ne!(xstate_bv(&xsave) & XFEATURE_YMM, 0);
        assert_eq!(upper_halves(&xsave), area);
        // Only the component's bytes and its XSTATE_BV bit changed.
        assert_eq!(xsave.region[..XSTATE_BV_OFFSET / 4], [0; 128]);
        assert_eq!(
            xsave.region[(YMM_HI128_OFFSET + AREA_BYTES) / 4..],
            [0; 816]
        );
    }

    #[test]
    fn a_component_in_its_initial_state_reads_as_zeros() {
        let mut xsave = kvm_xsave::default();
        set_upper_halves(&mut xsave, &[0xff; AREA_BYTES]);
        xsave.region[XSTATE_BV_OFFSET / 4] &= !(XFEATURE_YMM as u32);
        assert_eq!(upper_halves(&xsave), [0; AREA_BYTES]);
    }
}
