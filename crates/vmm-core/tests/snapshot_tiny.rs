//! Snapshots against real KVM with a tiny guest run as a whole machine (vCPU
//! threads, devices, event loop): it counts in memory and prints the count
//! to the serial port; snapshotted mid-run and restored in a new machine,
//! it goes on counting from where it was.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testkit::disks::{FailingDisk, SmallDisk};
use vmm_core::devices::serial::{ConsoleSink, COM1_PORT_BASE};
use vmm_core::disk_copy::copy_disk;
use vmm_core::layout::{TINY_DATA_START, TINY_PVCLOCK_START};
use vmm_core::machine::{DiskConfig, MachineError, PreparedVm, RestoreConfig, VsockConfig};
use vmm_core::snapshot::format::FormatError;
use vmm_core::snapshot::{SnapshotError, SnapshotFiles};
use vmm_core::tiny::{asm, elf_kernel};
use vmm_core::{CpuTemplate, Machine, MachineConfig, StopReason};

const MEM_MIB: u64 = 32;

/// Loops forever: `inc dword [TINY_DATA_START]`, print its low byte to
/// COM1, spin a little.
fn counter_code() -> Vec<u8> {
    counting(Vec::new(), &[])
}

/// `first`, then [`counter_code`]'s loop with `each_turn` at its top (RBX
/// holds `TINY_DATA_START`).
fn counting(mut code: Vec<u8>, each_turn: &[u8]) -> Vec<u8> {
    code.extend(asm::mov_ebx(TINY_DATA_START as u32));
    let top = code.len();
    code.extend(each_turn);
    code.extend(asm::INC_DWORD_AT_RBX);
    code.extend(asm::LOAD_EAX_FROM_RBX);
    code.extend(asm::mov_dx(COM1_PORT_BASE as u16));
    code.push(asm::OUT_DX_AL);
    code.extend(asm::mov_ecx(200));
    code.extend(asm::SPIN_ECX);
    let jmp = asm::jmp_back(code.len(), top);
    code.extend(jmp);
    code
}

fn wait_for(what: &str, out: &testkit::Capture, bytes: usize) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while out.bytes().len() < bytes {
        assert!(Instant::now() < deadline, "{what}: only {:?}", out.bytes());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn counter_in(snapshot: &Path) -> u32 {
    let mem = std::fs::read(SnapshotFiles::new(snapshot).memory()).unwrap();
    let at = TINY_DATA_START as usize;
    u32::from_le_bytes(mem[at..at + 4].try_into().unwrap())
}

fn console(out: &testkit::Capture) -> ConsoleSink {
    ConsoleSink::new().with(Box::new(out.clone()))
}

/// The counting guest as a machine in `dir`, printing to `out`.
fn counter_machine(
    dir: &Path,
    out: &testkit::Capture,
    disks: Vec<DiskConfig>,
    vsock: Option<VsockConfig>,
) -> Machine {
    machine_of(&counter_code(), dir, out, disks, vsock)
}

/// A machine in `dir` running `code`, printing to `out`.
fn machine_of(
    code: &[u8],
    dir: &Path,
    out: &testkit::Capture,
    disks: Vec<DiskConfig>,
    vsock: Option<VsockConfig>,
) -> Machine {
    let kernel = dir.join("tiny.elf");
    std::fs::write(&kernel, elf_kernel(code)).unwrap();
    Machine::build(MachineConfig {
        kernel,
        initrd: None,
        extra_cmdline: None,
        mem_mib: MEM_MIB,
        vcpus: 1,
        template: CpuTemplate::Standard,
        console: console(out),
        disks,
        vsock,
        net: None,
        balloon: false,
    })
    .unwrap()
}

/// A fresh directory of the test's own, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn fresh(tag: &str) -> Self {
        let dir =
            Dir(std::env::temp_dir().join(format!("microagent-{tag}-{}", std::process::id())));
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir_all(&dir.0).unwrap();
        dir
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_counting_guest_goes_on_counting_after_a_restore_in_a_new_machine() {
    if testkit::require("snapshot_tiny", testkit::kvm()).is_none() {
        return;
    }
    let dir = Dir::fresh("snap-tiny");
    let disk = dir.0.join("disk.raw");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let empty = dir.0.join("empty.raw");
    std::fs::File::create(&empty).unwrap();
    let filled = dir.0.join("filled.raw");
    std::fs::File::create(&filled)
        .unwrap()
        .set_len(4096)
        .unwrap();

    let out = testkit::Capture::default();
    let machine = counter_machine(
        &dir.0,
        &out,
        vec![
            DiskConfig {
                path: disk.clone(),
                read_only: false,
                id: None,
            },
            // An empty slot, which a restore may fill with any disk.
            DiskConfig {
                path: empty.clone(),
                read_only: false,
                id: Some("slot".into()),
            },
        ],
        Some(VsockConfig {
            guest_cid: 3,
            uds_path: dir.0.join("v1.sock"),
            routes: Default::default(),
        }),
    );
    let handle = machine.handle();
    let run = std::thread::spawn(move || machine.run(Some(Duration::from_secs(300))));
    wait_for("first run", &out, 5);

    let snap = dir.0.join("snap");
    std::fs::create_dir(&snap).unwrap();
    let taken = handle.snapshot(&snap).unwrap();
    assert_eq!(taken.memory.len, MEM_MIB << 20);
    assert!(taken.memory.data_bytes < MEM_MIB << 20, "{taken:?}");
    assert_eq!(taken.disks.len(), 2, "the writable disks are copied");

    // Paused, the guest prints nothing; resumed, it goes on.
    handle.pause().unwrap();
    let printed = out.bytes().len();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(out.bytes().len(), printed, "a paused guest ran");
    handle.resume().unwrap();
    wait_for("after resume", &out, printed + 2);
    handle.stop();
    let end = run.join().unwrap().unwrap();
    assert_eq!(end.reason, StopReason::Stopped);
    assert!(handle.pause().is_err(), "a handle outlived its run");

    let counted = counter_in(&snap);
    assert!(counted >= 5, "snapshot taken at count {counted}");

    // Refusals first (nothing runs): corrupted state, wrong disk, short memory.
    let config = |snapshot: &Path, disk: &Path, sock: &str, out: &testkit::Capture| RestoreConfig {
        snapshot: snapshot.to_path_buf(),
        console: console(out),
        disks: vec![
            DiskConfig {
                path: disk.to_path_buf(),
                read_only: false,
                id: None,
            },
            DiskConfig {
                path: filled.clone(),
                read_only: true,
                id: Some("filled".into()),
            },
        ],
        vsock_uds: Some(dir.0.join(sock)),
        vsock_routes: Default::default(),
        net: None,
    };
    let restore = |snapshot: &Path, disk: &Path, sock: &str, out: &testkit::Capture| {
        Machine::restore(config(snapshot, disk, sock, out))
    };
    let files = SnapshotFiles::new(&snap);
    let disk2 = dir.0.join("disk2.raw");
    copy_disk(&files.disk(0), &disk2).unwrap();
    let good_state = std::fs::read(files.state()).unwrap();
    let mut bad = good_state.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    std::fs::write(files.state(), &bad).unwrap();
    let refused = restore(&snap, &disk2, "r1.sock", &out).unwrap_err();
    assert!(
        matches!(
            refused,
            MachineError::Snapshot(SnapshotError::Format {
                source: FormatError::Checksum,
                ..
            })
        ),
        "{refused:?}"
    );
    std::fs::write(files.state(), &good_state).unwrap();
    let refused = restore(&snap, &disk, "r2.sock", &out);
    assert!(refused.is_ok(), "same-size disk is accepted: {refused:?}");
    drop(refused);
    let small = dir.0.join("small.raw");
    std::fs::File::create(&small).unwrap().set_len(512).unwrap();
    assert!(matches!(
        restore(&snap, &small, "r3.sock", &out),
        Err(MachineError::SnapshotMismatch(_))
    ));

    // A VM prepared before the snapshot was known that does not fit it
    // (its vCPUs, its memory's size) is set aside, never a failure.
    for unfit in [
        PreparedVm::new(2).unwrap(),
        PreparedVm::with_memory(1, MEM_MIB * 2).unwrap(),
    ] {
        drop(Machine::restore_into(unfit, config(&snap, &disk2, "r4.sock", &out)).unwrap());
        let _ = std::fs::remove_file(dir.0.join("r4.sock"));
    }

    // The restore, on a VM prepared before it with its memory's range
    // registered (as a VMM waiting for its workspace makes one): a new
    // machine, a new console, the disk copy.
    let out2 = testkit::Capture::default();
    let prepared = PreparedVm::with_memory(1, MEM_MIB).unwrap();
    assert_eq!(
        (prepared.vcpu_count(), prepared.mem_mib()),
        (1, Some(MEM_MIB))
    );
    let machine = Machine::restore_into(prepared, config(&snap, &disk2, "v2.sock", &out2)).unwrap();
    let handle = machine.handle();
    let run = std::thread::spawn(move || machine.run(Some(Duration::from_secs(300))));
    wait_for("restored run", &out2, 3);
    let snap2 = dir.0.join("snap2");
    std::fs::create_dir(&snap2).unwrap();
    handle.snapshot(&snap2).unwrap();
    handle.stop();
    run.join().unwrap().unwrap();

    let printed = out2.bytes();
    let first = printed[0];
    // The snapshot may have caught the guest between its increment and
    // its print: then the first print repeats the saved count.
    assert!(
        first == counted as u8 || first == counted.wrapping_add(1) as u8,
        "restored guest printed {first} first; the snapshot held {counted}"
    );
    for pair in printed.windows(2).take(2) {
        assert_eq!(pair[1], pair[0].wrapping_add(1), "{printed:?}");
    }
    assert!(
        counter_in(&snap2) > counted,
        "a snapshot of the restored machine"
    );
}

/// The kvm-clock MSR (KVM's "system time, new"): the guest names where
/// KVM keeps its clock record, bit 0 enabling it.
const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
/// The record's `flags` byte, and its bit "stopped by the host"
/// (`PVCLOCK_GUEST_STOPPED`), which a Linux guest reads (and clears)
/// before it reports an RCU stall or a soft lockup.
const PVCLOCK_FLAGS: u64 = 29;
const PVCLOCK_GUEST_STOPPED: u8 = 1 << 1;
/// Where the clock guest counts the stopped marks it saw, beside its
/// counter in the data page.
const MARKS_SEEN: u64 = 4;

/// The kvm-clock record's version, and how many stopped marks the guest
/// saw, in a snapshot's memory.
fn clock_guest_in(snapshot: &Path) -> (u32, u32) {
    let mem = std::fs::read(SnapshotFiles::new(snapshot).memory()).unwrap();
    let word = |at: u64| u32::from_le_bytes(mem[at as usize..at as usize + 4].try_into().unwrap());
    (word(TINY_PVCLOCK_START), word(TINY_DATA_START + MARKS_SEEN))
}

/// A machine restored from `snapshot` (no disks, vsock or network),
/// printing to `out`, running on a thread of its own.
fn run_restored(
    snapshot: PathBuf,
    out: &testkit::Capture,
) -> (
    vmm_core::machine::MachineHandle,
    std::thread::JoinHandle<Result<vmm_core::machine::RunOutcome, MachineError>>,
) {
    let restored = Machine::restore(RestoreConfig {
        snapshot,
        console: console(out),
        disks: Vec::new(),
        vsock_uds: None,
        vsock_routes: Default::default(),
        net: None,
    })
    .unwrap();
    let handle = restored.handle();
    let run = std::thread::spawn(move || restored.run(Some(Duration::from_secs(300))));
    (handle, run)
}

#[test]
fn a_paused_guest_learns_from_its_kvm_clock_that_the_host_stopped_it() {
    if testkit::require("snapshot_tiny", testkit::kvm()).is_none() {
        return;
    }
    let dir = Dir::fresh("snap-clock");
    // Turns kvm-clock on (its record at TINY_PVCLOCK_START), then counts,
    // and at each turn, as Linux does, clears a stopped mark it finds and
    // counts it.
    let mut enable = asm::mov_ecx(MSR_KVM_SYSTEM_TIME_NEW);
    enable.extend(asm::mov_eax(TINY_PVCLOCK_START as u32 | 1));
    enable.extend(asm::ZERO_EDX);
    enable.extend(asm::WRMSR);
    let flags = (TINY_PVCLOCK_START - TINY_DATA_START + PVCLOCK_FLAGS) as u8;
    let mut each_turn = asm::test_byte_at_rbx(flags, PVCLOCK_GUEST_STOPPED);
    let mut seen = asm::and_byte_at_rbx(flags, !PVCLOCK_GUEST_STOPPED);
    seen.extend(asm::inc_dword_at_rbx(MARKS_SEEN as u8));
    each_turn.extend(asm::jz_forward(seen.len() as u8));
    each_turn.extend(seen);
    let out = testkit::Capture::default();
    let machine = machine_of(
        &counting(enable, &each_turn),
        &dir.0,
        &out,
        Vec::new(),
        None,
    );
    let handle = machine.handle();
    let run = std::thread::spawn(move || machine.run(Some(Duration::from_secs(300))));
    wait_for("first run", &out, 3);
    let snapshot = |handle: &vmm_core::machine::MachineHandle, name: &str| {
        let to = dir.0.join(name);
        std::fs::create_dir(&to).unwrap();
        handle.snapshot(&to).unwrap();
        clock_guest_in(&to)
    };

    // A snapshot pauses the guest too, but writes its memory before the
    // guest runs again: KVM writes the mark only as a vCPU enters.
    let (version, marks) = snapshot(&handle, "before");
    assert_ne!(version, 0, "KVM never wrote the guest's kvm-clock record");
    assert_eq!(marks, 0, "a mark before any pause");
    // That snapshot's pause, then this one: a mark after each.
    handle.pause().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    handle.resume().unwrap();
    let printed = out.bytes().len();
    wait_for("after the pause", &out, printed + 2);
    let (_, marks) = snapshot(&handle, "after");
    assert_eq!(
        marks, 2,
        "the guest saw {marks} stopped marks after two pauses"
    );
    // A snapshot of a paused machine (a hibernation after an idle pause):
    // the mark its pause asked for dies with the machine; the restore asks
    // again. (The last snapshot's pause left a third mark.)
    handle.pause().unwrap();
    let (_, marks) = snapshot(&handle, "paused");
    assert_eq!(marks, 3);
    handle.stop();
    run.join().unwrap().unwrap();
    let out = testkit::Capture::default();
    let (handle, run) = run_restored(dir.0.join("paused"), &out);
    wait_for("the restored run", &out, 2);
    let (_, marks) = snapshot(&handle, "restored");
    assert_eq!(marks, 4, "the restored guest saw {marks} stopped marks");
    handle.stop();
    run.join().unwrap().unwrap();
}

#[test]
fn a_paused_guest_s_clock_stands_still_when_asked_and_a_snapshot_keeps_it() {
    if testkit::require("snapshot_tiny", testkit::kvm()).is_none() {
        return;
    }
    let dir = Dir::fresh("snap-frozen-clock");
    let out = testkit::Capture::default();
    let machine = counter_machine(&dir.0, &out, Vec::new(), None);
    let handle = machine.handle();
    let run = std::thread::spawn(move || machine.run(Some(Duration::from_secs(300))));
    wait_for("first run", &out, 3);
    let pause = Duration::from_secs(2);
    // At first (a guest with no agent to tell it the time) the clock runs
    // on through a pause.
    let before = handle.clock().unwrap();
    handle.pause().unwrap();
    std::thread::sleep(pause);
    handle.resume().unwrap();
    let ran = Duration::from_nanos(handle.clock().unwrap() - before);
    assert!(
        ran >= pause,
        "the clock moved {ran:?} over a {pause:?} pause"
    );

    handle.clock_stops_with_pauses(true);
    let began = Instant::now();
    let before = handle.clock().unwrap();
    handle.pause().unwrap();
    let frozen = handle.clock().unwrap();
    std::thread::sleep(pause);
    assert_eq!(
        handle.clock().unwrap(),
        frozen,
        "the clock ran while paused"
    );
    handle.resume().unwrap();
    let printed = out.bytes().len();
    wait_for("after the pause", &out, printed + 2);
    let ran = Duration::from_nanos(handle.clock().unwrap() - before);
    let wall = began.elapsed();
    assert!(
        ran + pause <= wall + Duration::from_millis(20) && ran > Duration::ZERO,
        "the guest's clock moved {ran:?} over {wall:?} with a {pause:?} pause"
    );

    // A snapshot of a paused machine (a hibernation after an idle pause)
    // keeps the clock it paused with, not the host's time since.
    handle.pause().unwrap();
    let frozen = handle.clock().unwrap();
    std::thread::sleep(pause);
    let to = dir.0.join("paused");
    std::fs::create_dir(&to).unwrap();
    handle.snapshot(&to).unwrap();
    handle.stop();
    run.join().unwrap().unwrap();
    let (handle, run) = run_restored(to, &testkit::Capture::default());
    let restored_at = handle.clock().unwrap();
    handle.stop();
    run.join().unwrap().unwrap();
    let moved = Duration::from_nanos(restored_at.saturating_sub(frozen));
    assert!(
        moved < pause / 2,
        "the restored clock is {moved:?} past the paused one"
    );
}

/// A running machine's snapshot onto a disk that fails: a clear error
/// naming `errors`, and the machine runs on and snapshots whole into a
/// directory with room. `onto` makes the failing directory (and keeps what
/// mounts it alive until the snapshot failed).
fn a_failed_snapshot_leaves_the_guest_running<G>(
    test: &str,
    onto: impl FnOnce(&Path) -> Option<(PathBuf, G)>,
    errors: &[&str],
) {
    if testkit::require(test, testkit::kvm()).is_none() {
        return;
    }
    let dir = Dir::fresh(test);
    let Some((failing, disk)) = onto(&dir.0) else {
        return;
    };
    let out = testkit::Capture::default();
    let machine = counter_machine(&dir.0, &out, Vec::new(), None);
    let handle = machine.handle();
    let run = std::thread::spawn(move || machine.run(Some(Duration::from_secs(300))));
    wait_for("first run", &out, 5);

    let refused = handle.snapshot(&failing);
    drop(disk);
    let err = refused.unwrap_err();
    let chain = format!("{err}: {:?}", std::error::Error::source(&err));
    assert!(errors.iter().any(|e| chain.contains(e)), "{chain}");

    // It runs on, and a snapshot with room is whole.
    let printed = out.bytes().len();
    wait_for("after the failed snapshot", &out, printed + 2);
    let good = dir.0.join("good");
    std::fs::create_dir(&good).unwrap();
    let taken = handle.snapshot(&good).unwrap();
    assert_eq!(taken.memory.len, MEM_MIB << 20);
    handle.stop();
    let end = run.join().unwrap().unwrap();
    assert_eq!(end.reason, StopReason::Stopped);
}

/// ENOSPC while a running machine writes its snapshot (the directory a
/// 16 KiB tmpfs, root only).
#[test]
fn a_snapshot_onto_a_full_disk_fails_and_the_guest_runs_on() {
    let test = "a_snapshot_onto_a_full_disk_fails_and_the_guest_runs_on";
    a_failed_snapshot_leaves_the_guest_running(
        test,
        |dir| {
            let disk = SmallDisk::mount(test, &dir.join("full"), "16k")?;
            Some((disk.path().to_owned(), disk))
        },
        &["No space left", "os error 28"],
    );
}

/// EIO while a running machine writes its snapshot (a disk whose device
/// fails every write, root only): the snapshot syncs its files, so the
/// error is reported, not found at the next restore.
#[test]
fn a_snapshot_onto_a_failing_disk_fails_and_the_guest_runs_on() {
    let test = "a_snapshot_onto_a_failing_disk_fails_and_the_guest_runs_on";
    a_failed_snapshot_leaves_the_guest_running(
        test,
        |dir| {
            let mut disk = FailingDisk::mount(test, &dir.join("eio"))?;
            let snap = disk.path().join("snap");
            std::fs::create_dir(&snap).unwrap();
            disk.fail(true);
            Some((snap, disk))
        },
        &["Input/output error", "os error 5"],
    );
}
