//! The boot GDT and the KVM segment registers derived from it.
//!
//! The 64-bit Linux boot protocol asks for flat segments with `__BOOT_CS` =
//! 0x10 and `__BOOT_DS` = 0x18, so entries 0 and 1 are null.

use kvm_bindings::kvm_segment;

/// One 8-byte segment descriptor, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// Segment base.
    pub base: u32,
    /// 20-bit limit, in pages when `flags` has the granularity bit.
    pub limit: u32,
    /// Access byte: present, DPL, S, type.
    pub access: u8,
    /// High nibble flags: granularity, default size, long mode, available.
    pub flags: u8,
}

const FLAG_AVL: u8 = 0x1;
const FLAG_LONG: u8 = 0x2;
const FLAG_DB: u8 = 0x4;
const FLAG_GRANULARITY: u8 = 0x8;

impl Descriptor {
    /// A null descriptor.
    pub const NULL: Self = Self {
        base: 0,
        limit: 0,
        access: 0,
        flags: 0,
    };
    /// Flat 64-bit code: present, ring 0, execute/read, accessed; long mode, 4 KiB granularity.
    pub const CODE64: Self = Self {
        base: 0,
        limit: 0xfffff,
        access: 0x9b,
        flags: FLAG_GRANULARITY | FLAG_LONG,
    };
    /// Flat data: present, ring 0, read/write, accessed; 32-bit default size, 4 KiB granularity.
    pub const DATA: Self = Self {
        base: 0,
        limit: 0xfffff,
        access: 0x93,
        flags: FLAG_GRANULARITY | FLAG_DB,
    };
    /// A busy 64-bit TSS (KVM requires a usable TR in long mode).
    pub const TSS: Self = Self {
        base: 0,
        limit: 0xfffff,
        access: 0x8b,
        flags: FLAG_GRANULARITY,
    };

    /// The descriptor as the CPU reads it from memory.
    pub fn encode(self) -> u64 {
        let base = u64::from(self.base);
        let limit = u64::from(self.limit);
        (limit & 0xffff)
            | ((base & 0xff_ffff) << 16)
            | (u64::from(self.access) << 40)
            | (((limit >> 16) & 0xf) << 48)
            | (u64::from(self.flags & 0xf) << 52)
            | (((base >> 24) & 0xff) << 56)
    }

    /// The segment register KVM should load for this descriptor at `index`.
    pub fn to_kvm_segment(self, index: u16) -> kvm_segment {
        let present = self.access >> 7;
        let limit = if self.flags & FLAG_GRANULARITY != 0 {
            (self.limit << 12) | 0xfff
        } else {
            self.limit
        };
        kvm_segment {
            base: u64::from(self.base),
            limit,
            selector: index * 8,
            type_: self.access & 0xf,
            present,
            dpl: (self.access >> 5) & 0x3,
            db: u8::from(self.flags & FLAG_DB != 0),
            s: (self.access >> 4) & 0x1,
            l: u8::from(self.flags & FLAG_LONG != 0),
            g: u8::from(self.flags & FLAG_GRANULARITY != 0),
            avl: u8::from(self.flags & FLAG_AVL != 0),
            unusable: u8::from(present == 0),
            padding: 0,
        }
    }
}

/// GDT index of the code segment (selector 0x10, `__BOOT_CS`).
pub const CODE_INDEX: u16 = 2;
/// GDT index of the data segment (selector 0x18, `__BOOT_DS`).
pub const DATA_INDEX: u16 = 3;
/// GDT index of the task state segment (selector 0x20).
pub const TSS_INDEX: u16 = 4;

/// The boot GDT, indexed as above.
pub const BOOT_GDT: [Descriptor; 5] = [
    Descriptor::NULL,
    Descriptor::NULL,
    Descriptor::CODE64,
    Descriptor::DATA,
    Descriptor::TSS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_architectural_flat_descriptors() {
        // Values as the Intel SDM lays them out (and as Linux's own GDT_ENTRY makes them).
        assert_eq!(Descriptor::CODE64.encode(), 0x00af_9b00_0000_ffff);
        assert_eq!(Descriptor::DATA.encode(), 0x00cf_9300_0000_ffff);
        assert_eq!(Descriptor::TSS.encode(), 0x008f_8b00_0000_ffff);
        assert_eq!(Descriptor::NULL.encode(), 0);
    }

    #[test]
    fn encodes_base_and_limit_bits() {
        let d = Descriptor {
            base: 0x1234_5678,
            limit: 0xa_bcde,
            access: 0x93,
            flags: 0x4,
        };
        let raw = d.encode();
        assert_eq!(raw & 0xffff, 0xbcde);
        assert_eq!((raw >> 16) & 0xff_ffff, 0x34_5678);
        assert_eq!((raw >> 48) & 0xf, 0xa);
        assert_eq!(raw >> 56, 0x12);
    }

    #[test]
    fn kvm_segments_match_the_boot_protocol() {
        let cs = BOOT_GDT[CODE_INDEX as usize].to_kvm_segment(CODE_INDEX);
        assert_eq!(cs.selector, 0x10);
        assert_eq!(
            (cs.l, cs.db, cs.g, cs.present, cs.s, cs.type_),
            (1, 0, 1, 1, 1, 0xb)
        );
        assert_eq!(cs.limit, 0xffff_ffff);
        let ds = BOOT_GDT[DATA_INDEX as usize].to_kvm_segment(DATA_INDEX);
        assert_eq!(ds.selector, 0x18);
        assert_eq!((ds.l, ds.db, ds.type_), (0, 1, 0x3));
        let tss = BOOT_GDT[TSS_INDEX as usize].to_kvm_segment(TSS_INDEX);
        assert_eq!((tss.s, tss.type_, tss.unusable), (0, 0xb, 0));
        assert_eq!(Descriptor::NULL.to_kvm_segment(0).unusable, 1);
    }
}
