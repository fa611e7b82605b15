//! The VMM against real KVM with tiny hand-assembled guests: a few
//! instructions each, fast even where guest kernel mode is emulated.

use std::io::Write;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};
use vmm_core::arch::cpuid::{CpuTemplate, VcpuTopology};
use vmm_core::devices::i8042::{I8042, I8042_PORT_BASE, I8042_PORT_LEN};
use vmm_core::devices::serial::{ConsoleSink, Serial, COM1_PORT_BASE, COM_PORT_LEN};
use vmm_core::devices::{BusDevice, DeviceAction};
use vmm_core::exit::Buses;
use vmm_core::layout::PROBE_CODE_START;
use vmm_core::tiny::{asm, TinyGuest};
use vmm_core::vcpu::{configure, stop_all, RunControl, VcpuThread, VcpuThreadState};
use vmm_core::xstate_switch::{self, XstateSwitch};
use vmm_core::StopReason;

fn kvm(test: &str) -> bool {
    testkit::require(test, testkit::kvm()).is_some()
}

/// A port device that records what the guest writes to it.
#[derive(Clone, Default)]
struct Recorder(testkit::Capture);

impl BusDevice for Recorder {
    fn read(&mut self, _: u64, data: &mut [u8]) {
        data.fill(0);
    }
    fn write(&mut self, _: u64, data: &[u8]) -> DeviceAction {
        let _ = self.0.write_all(data);
        DeviceAction::None
    }
}

fn serial_guest() -> (TinyGuest, testkit::Capture) {
    let out = testkit::Capture::default();
    let irq = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let serial = Serial::new(irq, ConsoleSink::new().with(Box::new(out.clone())));
    let mut guest = TinyGuest::default();
    guest
        .buses
        .pio
        .insert(COM1_PORT_BASE, COM_PORT_LEN, Arc::new(Mutex::new(serial)))
        .unwrap();
    guest
        .buses
        .pio
        .insert(I8042_PORT_BASE, I8042_PORT_LEN, Arc::new(Mutex::new(I8042)))
        .unwrap();
    (guest, out)
}

#[test]
fn serial_output_reaches_the_console() {
    if !kvm("serial_output_reaches_the_console") {
        return;
    }
    let (guest, out) = serial_guest();
    let mut code = asm::out_bytes(COM1_PORT_BASE as u16, b"hello from ring 0\n");
    code.push(asm::HLT);
    let run = guest.run(&code).unwrap();
    assert_eq!(run.reason, StopReason::Halted);
    assert_eq!(out.text(), "hello from ring 0\n");
}

#[test]
fn i8042_reset_ends_the_vm_cleanly() {
    if !kvm("i8042_reset_ends_the_vm_cleanly") {
        return;
    }
    let (guest, out) = serial_guest();
    let mut code = asm::out_bytes(COM1_PORT_BASE as u16, b"x");
    code.extend(asm::out_bytes(0x64, &[0xfe]));
    // Never reached: the reset stops the VM first.
    code.extend(asm::out_bytes(COM1_PORT_BASE as u16, b"y"));
    code.push(asm::HLT);
    let run = guest.run(&code).unwrap();
    assert_eq!(run.reason, StopReason::Reset);
    assert_eq!(out.bytes(), b"x");
}

#[test]
fn hlt_without_irqchip_exits() {
    if !kvm("hlt_without_irqchip_exits") {
        return;
    }
    let run = TinyGuest::default().run(&[asm::HLT]).unwrap();
    assert_eq!(run.reason, StopReason::Halted);
    assert_eq!(run.exits, 1);
}

#[test]
fn unclaimed_ports_read_all_ones() {
    if !kvm("unclaimed_ports_read_all_ones") {
        return;
    }
    let recorder = Recorder::default();
    let mut guest = TinyGuest::default();
    guest
        .buses
        .pio
        .insert(0x500, 1, Arc::new(Mutex::new(recorder.clone())))
        .unwrap();
    // in al, 0x2f8 (COM2, absent); out 0x500, al; write to an absent port; hlt.
    let mut code = asm::mov_dx(0x2f8);
    code.push(asm::IN_AL_DX);
    code.extend(asm::mov_dx(0x500));
    code.push(asm::OUT_DX_AL);
    code.extend(asm::out_bytes(0x2e8, &[0x42]));
    code.push(asm::HLT);
    let run = guest.run(&code).unwrap();
    assert_eq!(run.reason, StopReason::Halted);
    assert_eq!(recorder.0.bytes(), [0xff]);
}

#[test]
fn host_probe_measures_ring0_speed() {
    if !kvm("host_probe_measures_ring0_speed") {
        return;
    }
    let profile = vmm_core::host::probe().unwrap();
    eprintln!(
        "KVM here: {} ({:.1} ns per ring-0 iteration, probe {:?})",
        profile.mode.name(),
        profile.ring0_ns_per_iteration,
        profile.probe_time
    );
    assert!(profile.ring0_ns_per_iteration > 0.0);
    let again = vmm_core::HostProfile::from_measurement(
        profile.probe_time,
        vmm_core::host::PROBE_ITERATIONS,
    );
    assert_eq!(again.mode, profile.mode);
    assert!(
        profile.probe_time < Duration::from_secs(5),
        "the probe must stay well under a second or so"
    );
}

#[test]
fn a_spinning_vcpu_is_kicked_out_of_kvm_run() {
    if !kvm("a_spinning_vcpu_is_kicked_out_of_kvm_run") {
        return;
    }
    // jmp $ (spins forever in ring 0) on a vCPU thread; stop_all must end it.
    let mem = vmm_core::memory::create_guest_memory(16).unwrap();
    vmm_core::arch::write_boot_tables(&mem).unwrap();
    mem.write_slice(&[0xeb, 0xfe], GuestAddress(PROBE_CODE_START))
        .unwrap();
    let vm = vmm_core::vm::Vm::new().unwrap();
    vm.register_memory(&mem).unwrap();
    let supported = vm.supported_cpuid().unwrap();
    let fd = vm.create_vcpu(0).unwrap();
    let topo = VcpuTopology { index: 0, count: 1 };
    configure(
        &fd,
        &supported,
        CpuTemplate::Standard,
        topo,
        Some(PROBE_CODE_START),
        false,
    )
    .unwrap();
    let control = Arc::new(RunControl::default());
    let (tx, rx) = mpsc::channel::<vmm_core::vcpu::VcpuExitReport>();
    let thread =
        VcpuThread::spawn(0, fd, Arc::new(Buses::default()), None, control.clone(), tx).unwrap();
    assert!(testkit::wait_until(Duration::from_secs(5), || control
        .first_run_ns()
        .is_some()));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(thread.state(), VcpuThreadState::Running);
    let mut threads = [thread];
    let fds = stop_all(&control, &mut threads);
    assert_eq!(threads[0].state(), VcpuThreadState::Exited);
    assert_eq!(fds.len(), 1, "the vCPU thread ended and handed back its fd");
    let regs = fds[0].get_regs().unwrap();
    assert_eq!(regs.rip, PROBE_CODE_START, "still on the jmp $");
    assert!(
        rx.try_recv().is_err(),
        "a requested stop is not reported as a guest stop"
    );
}

#[test]
fn extended_fpu_state_goes_through_kvm_xsave_state() {
    let test = "extended_fpu_state_goes_through_kvm_xsave_state";
    if !kvm(test) {
        return;
    }
    // The compat kernel's two requests, from a ring-0 tiny guest: load the
    // extended state from area A, save it to area B, halt. B must then hold
    // A's components: they went into the vCPU's XSAVE state and came back.
    const AREA_A: u64 = 0x20_0000;
    const AREA_B: u64 = 0x20_1000;
    let mem = vmm_core::memory::create_guest_memory(16).unwrap();
    vmm_core::arch::write_boot_tables(&mem).unwrap();
    let vm = vmm_core::vm::Vm::new().unwrap();
    vm.register_memory(&mem).unwrap();
    let supported = vm.supported_cpuid().unwrap();
    let mut guest_cpuid = supported.as_slice().to_vec();
    vmm_core::arch::cpuid::apply_template(
        CpuTemplate::Compat,
        &mut guest_cpuid,
        VcpuTopology { index: 0, count: 1 },
    );
    // The components the compat guest lists, each (bit, offset, size) as
    // the host lays them out; the area starts at the XSAVE header (512).
    let listed = guest_cpuid
        .iter()
        .find(|e| e.function == 0xd && e.index == 0)
        .map_or(0, |e| e.eax);
    let components: Vec<(u32, usize, usize)> = guest_cpuid
        .iter()
        .filter(|e| e.function == 0xd && (2..32).contains(&e.index) && listed & (1 << e.index) != 0)
        .map(|e| (e.index, e.ebx as usize - 512, e.eax as usize))
        .collect();
    if !components.iter().any(|c| c.0 == 2) {
        testkit::skip(test, "this host's KVM offers no AVX state (CPUID leaf 0xD)");
        return;
    }
    let mut pattern = vec![0u8; xstate_switch::AREA_BYTES];
    let mut bv = 0u64;
    for &(bit, offset, size) in &components {
        bv |= 1 << bit;
        for (i, b) in pattern[offset..offset + size].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(7) ^ (0xa5 + bit as u8);
        }
    }
    pattern[..8].copy_from_slice(&bv.to_le_bytes());
    mem.write_slice(&pattern, GuestAddress(AREA_A)).unwrap();
    let mut code = asm::mov_dx(xstate_switch::LOAD_PORT);
    code.extend(asm::mov_eax((AREA_A >> 6) as u32));
    code.push(asm::OUT_DX_EAX);
    code.extend(asm::mov_dx(xstate_switch::SAVE_PORT));
    code.extend(asm::mov_eax((AREA_B >> 6) as u32));
    code.push(asm::OUT_DX_EAX);
    code.push(asm::HLT);
    mem.write_slice(&code, GuestAddress(PROBE_CODE_START))
        .unwrap();
    let Some(xstate) = XstateSwitch::new(mem.clone(), vm.xsave_size()) else {
        testkit::skip(test, "this host's XSAVE area is larger than kvm_xsave");
        return;
    };
    let fd = vm.create_vcpu(0).unwrap();
    configure(
        &fd,
        &supported,
        CpuTemplate::Compat,
        VcpuTopology { index: 0, count: 1 },
        Some(PROBE_CODE_START),
        false,
    )
    .unwrap();
    let control = Arc::new(RunControl::default());
    let (tx, rx) = mpsc::channel::<vmm_core::vcpu::VcpuExitReport>();
    let thread = VcpuThread::spawn(
        0,
        fd,
        Arc::new(Buses::default()),
        Some(xstate),
        control.clone(),
        tx,
    )
    .unwrap();
    let report = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(report.reason, StopReason::Halted, "{:?}", report.registers);
    stop_all(&control, &mut [thread]);
    let mut back = vec![0u8; xstate_switch::AREA_BYTES];
    mem.read_slice(&mut back, GuestAddress(AREA_B)).unwrap();
    let back_bv = u64::from_le_bytes(back[..8].try_into().unwrap());
    assert_eq!(back_bv & bv, bv, "every component came back in use");
    for &(bit, offset, size) in &components {
        assert_eq!(
            back[offset..offset + size],
            pattern[offset..offset + size],
            "component {bit}"
        );
    }
}
