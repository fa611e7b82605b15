//! Tiny hand-assembled guests: a few instructions run in 64-bit ring 0 on
//! one vCPU, on the calling thread. The host probe times one; tests use them
//! to exercise exits and devices without a kernel.

use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use crate::arch::cpuid::{CpuTemplate, VcpuTopology};
use crate::arch::{write_boot_tables, BootTablesError};
use crate::exit::{handle_exit, Buses, ExitAction, StopReason};
use crate::layout::PROBE_CODE_START;
use crate::memory::{create_guest_memory, MemoryError, MIN_MEM_MIB};
use crate::vcpu::{configure, VcpuError};
use crate::vm::{Vm, VmError};

/// Why a tiny guest could not run.
#[derive(Debug, thiserror::Error)]
pub enum TinyGuestError {
    /// Guest memory.
    #[error("could not set up guest memory")]
    Memory(#[from] MemoryError),
    /// The VM.
    #[error("could not set up the VM")]
    Vm(#[from] VmError),
    /// The vCPU.
    #[error("could not set up the vCPU")]
    Vcpu(#[from] VcpuError),
    /// Boot tables.
    #[error("could not write boot tables")]
    BootTables(#[from] BootTablesError),
    /// The code did not fit.
    #[error("could not write the guest code")]
    Code(#[source] vm_memory::GuestMemoryError),
    /// KVM_RUN itself failed.
    #[error("KVM_RUN failed")]
    Run(#[source] kvm_ioctls::Error),
}

/// How a tiny guest ended.
#[derive(Debug)]
pub struct TinyRun {
    /// Why it stopped.
    pub reason: StopReason,
    /// Wall time spent in the run loop (entering the guest until it stopped).
    pub elapsed: Duration,
    /// Number of exits handled.
    pub exits: u64,
}

/// A one-vCPU VM running `code` at [`PROBE_CODE_START`] in 64-bit ring 0.
#[derive(Debug)]
pub struct TinyGuest {
    /// Devices the guest can reach.
    pub buses: Buses,
    /// Whether to create the in-kernel irqchip (then HLT does not exit).
    pub irqchip: bool,
    /// Most exits handled before giving up (a runaway guest).
    pub max_exits: u64,
}

impl Default for TinyGuest {
    fn default() -> Self {
        Self {
            buses: Buses::default(),
            irqchip: false,
            max_exits: 1_000_000,
        }
    }
}

impl TinyGuest {
    /// Runs `code` until it stops the VM.
    pub fn run(&self, code: &[u8]) -> Result<TinyRun, TinyGuestError> {
        let mem = create_guest_memory(MIN_MEM_MIB)?;
        write_boot_tables(&mem)?;
        mem.write_slice(code, GuestAddress(PROBE_CODE_START))
            .map_err(TinyGuestError::Code)?;
        let vm = Vm::new()?;
        vm.register_memory(&mem)?;
        if self.irqchip {
            vm.create_irqchip_and_pit()?;
        }
        let supported = vm.supported_cpuid()?;
        let mut vcpu = vm.create_vcpu(0)?;
        configure(
            &vcpu,
            &supported,
            CpuTemplate::Standard,
            VcpuTopology { index: 0, count: 1 },
            Some(PROBE_CODE_START),
            self.irqchip,
        )?;
        let start = Instant::now();
        let mut exits = 0;
        let reason = loop {
            let exit = vcpu.run().map_err(TinyGuestError::Run)?;
            exits += 1;
            if let ExitAction::Stop(reason) = handle_exit(exit, &self.buses) {
                break reason;
            }
            if exits >= self.max_exits {
                break StopReason::KvmFailure(format!("guest still running after {exits} exits"));
            }
        };
        Ok(TinyRun {
            reason,
            elapsed: start.elapsed(),
            exits,
        })
    }
}

/// `code` as a minimal ELF64 executable whose one segment loads at, and is
/// entered at, [`crate::layout::TINY_KERNEL_START`], so a tiny guest can be
/// run as a whole [`crate::machine::Machine`] (vCPU threads, devices,
/// snapshots) in place of a Linux kernel.
pub fn elf_kernel(code: &[u8]) -> Vec<u8> {
    const EHDR: u16 = 64;
    const PHDR: u16 = 56;
    let load = crate::layout::TINY_KERNEL_START;
    let offset = u64::from(EHDR + PHDR);
    let mut elf = Vec::with_capacity(offset as usize + code.len());
    elf.extend_from_slice(b"\x7fELF");
    elf.extend_from_slice(&[2, 1, 1]); // 64-bit, little-endian, version 1
    elf.extend_from_slice(&[0; 9]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&0x3eu16.to_le_bytes()); // EM_X86_64
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&load.to_le_bytes()); // e_entry
    elf.extend_from_slice(&u64::from(EHDR).to_le_bytes()); // e_phoff
    elf.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    elf.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    for half in [EHDR, PHDR, 1, 0, 0, 0] {
        // e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
        elf.extend_from_slice(&half.to_le_bytes());
    }
    elf.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    elf.extend_from_slice(&5u32.to_le_bytes()); // R+X
    for word in [
        offset,
        load,
        load,
        code.len() as u64,
        code.len() as u64,
        0x1000,
    ] {
        // p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
        elf.extend_from_slice(&word.to_le_bytes());
    }
    elf.extend_from_slice(code);
    elf
}

/// Hand assembly for tiny guests (x86-64 encodings).
pub mod asm {
    /// `mov ecx, imm32`.
    pub fn mov_ecx(imm: u32) -> Vec<u8> {
        let mut v = vec![0xb9];
        v.extend_from_slice(&imm.to_le_bytes());
        v
    }
    /// `mov dx, imm16`.
    pub fn mov_dx(imm: u16) -> Vec<u8> {
        let mut v = vec![0x66, 0xba];
        v.extend_from_slice(&imm.to_le_bytes());
        v
    }
    /// `mov al, imm8`.
    pub fn mov_al(imm: u8) -> Vec<u8> {
        vec![0xb0, imm]
    }
    /// `mov eax, imm32`.
    pub fn mov_eax(imm: u32) -> Vec<u8> {
        let mut v = vec![0xb8];
        v.extend_from_slice(&imm.to_le_bytes());
        v
    }
    /// `out dx, al`.
    pub const OUT_DX_AL: u8 = 0xee;
    /// `out dx, eax`.
    pub const OUT_DX_EAX: u8 = 0xef;
    /// `in al, dx`.
    pub const IN_AL_DX: u8 = 0xec;
    /// `hlt`.
    pub const HLT: u8 = 0xf4;
    /// `dec ecx; jnz -4`: spins ECX times.
    pub const SPIN_ECX: [u8; 4] = [0xff, 0xc9, 0x75, 0xfc];

    /// `mov ebx, imm32`.
    pub fn mov_ebx(imm: u32) -> Vec<u8> {
        let mut v = vec![0xbb];
        v.extend_from_slice(&imm.to_le_bytes());
        v
    }
    /// `inc dword [rbx]`.
    pub const INC_DWORD_AT_RBX: [u8; 2] = [0xff, 0x03];
    /// `mov eax, [rbx]`.
    pub const LOAD_EAX_FROM_RBX: [u8; 2] = [0x8b, 0x03];
    /// `test byte [rbx + disp8], imm8`.
    pub fn test_byte_at_rbx(disp: u8, imm: u8) -> Vec<u8> {
        vec![0xf6, 0x43, disp, imm]
    }
    /// `and byte [rbx + disp8], imm8`.
    pub fn and_byte_at_rbx(disp: u8, imm: u8) -> Vec<u8> {
        vec![0x80, 0x63, disp, imm]
    }
    /// `inc dword [rbx + disp8]`.
    pub fn inc_dword_at_rbx(disp: u8) -> Vec<u8> {
        vec![0xff, 0x43, disp]
    }
    /// `jz rel8`, forward over `skip` bytes.
    pub fn jz_forward(skip: u8) -> Vec<u8> {
        vec![0x74, skip]
    }
    /// `xor edx, edx`.
    pub const ZERO_EDX: [u8; 2] = [0x31, 0xd2];
    /// `wrmsr`: EDX:EAX into the MSR ECX names.
    pub const WRMSR: [u8; 2] = [0x0f, 0x30];
    /// `jmp rel8`.
    pub fn jmp_back(from_len: usize, to: usize) -> Vec<u8> {
        // rel8 counts from the end of the two-byte jmp.
        let rel = to as i64 - (from_len as i64 + 2);
        vec![0xeb, rel as i8 as u8]
    }

    /// Code that writes `bytes` to port `port`, one `out` each.
    pub fn out_bytes(port: u16, bytes: &[u8]) -> Vec<u8> {
        let mut code = mov_dx(port);
        for b in bytes {
            code.extend(mov_al(*b));
            code.push(OUT_DX_AL);
        }
        code
    }
}
