//! Seccomp filters for the VMM process, one per thread role. The vCPU and
//! device threads' lists are here, beside the machine that runs them; the
//! control threads' list ([`ControlRole`]) comes from the process that
//! embeds the machine, which knows what those threads do.
//!
//! A workspace's VMM parses every guest request; if a guest ever found a
//! bug in it, the filters bound what that bug can make the host do. Every
//! thread first gets the `control` filter (the broadest: it is installed
//! on all threads at once with TSYNC, before any guest code runs); vCPU
//! threads and the device thread then stack their own, narrower one at
//! their start, so a syscall must be in both. A syscall outside a thread's
//! filter raises SIGSYS: the handler writes which syscall and which role to
//! stderr (the workspace's `vmm.log`, where the crash report reads it) and
//! ends the process with [`SECCOMP_EXIT_CODE`].
//!
//! The lists were measured (strace of whole workspace life cycles: boot,
//! exec, files, ports, snapshots, forks, stop) and are grouped with a
//! reason each. Adding a device or a thread means extending its role's
//! list; the real-guest tests run under the filters and catch a missing one.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::BpfProgram;

mod program;

pub use program::ProgramError;
use program::{ArgIs, Rules, Width};

/// The exit status of a VMM process killed by its filter.
pub const SECCOMP_EXIT_CODE: i32 = 159;

/// The prefix of the line the SIGSYS handler writes.
pub const VIOLATION_PREFIX: &str = "microagent-vmm: seccomp:";

/// What a thread does, and so which syscalls it may make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadRole {
    /// Runs KVM_RUN and the devices it exits to (MMIO, port I/O).
    Vcpu,
    /// The device event loop: disk files, vsock and network sockets.
    Devices,
    /// Every other thread of the process that embeds the machine: what
    /// its [`ControlRole`] lists, and the machine's control operations
    /// (pausing, snapshots, interrupt wiring) it calls.
    Control,
}

impl ThreadRole {
    fn name(self) -> &'static str {
        match self {
            ThreadRole::Vcpu => "vcpu",
            ThreadRole::Devices => "devices",
            ThreadRole::Control => "control",
        }
    }
}

/// Why a filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The rules did not compile (a bug in this module).
    #[error("building the {role} seccomp filter")]
    Build {
        /// The role.
        role: &'static str,
        /// Why.
        #[source]
        source: ProgramError,
    },
    /// The kernel refused the filter.
    #[error("installing the {role} seccomp filter")]
    Install {
        /// The role.
        role: &'static str,
        /// What seccompiler said.
        #[source]
        source: seccompiler::Error,
    },
    /// The SIGSYS handler could not be installed.
    #[error("installing the SIGSYS handler")]
    Handler(#[source] std::io::Error),
    /// A program with its prefix is longer than the kernel takes.
    #[error("the {role} seccomp filter has {length} instructions; the kernel takes at most {MAX_INSTRUCTIONS}")]
    TooLong {
        /// The role.
        role: &'static str,
        /// Its instructions.
        length: usize,
    },
}

/// The most instructions a classic BPF program may have (`BPF_MAXINSNS`).
const MAX_INSTRUCTIONS: usize = 4096;

/// What the control threads of the process that embeds the machine do
/// (its control socket, agent link, ports, files, signals): that process
/// knows its threads, so it lists them. The filter adds the KVM requests
/// of the machine's own control operations, and lets `clone` start
/// threads only.
#[derive(Clone, Copy, Debug)]
pub struct ControlRole {
    /// Syscalls beyond the ones every thread makes.
    pub syscalls: &'static [i64],
    /// ioctl requests beyond the machine's.
    pub ioctls: &'static [u64],
    /// The socket families it opens (when `syscalls` has `socket`).
    pub socket_families: &'static [libc::c_int],
    /// The socket types it opens of those families (`SOCK_STREAM`, ...;
    /// never `SOCK_RAW` or `SOCK_PACKET`).
    pub socket_types: &'static [libc::c_int],
}

/// Syscalls every thread makes: memory, locks, signals, time, its own exit,
/// and the SIGSYS handler's report.
const EVERY_THREAD: &[i64] = &[
    // Allocation (the global allocator, thread stacks).
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_mremap,
    // Locks, condition variables, thread joins.
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    // Threads starting and ending (std's thread start, name and guard).
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_prctl,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_set_robust_list,
    libc::SYS_set_tid_address,
    libc::SYS_rseq,
    libc::SYS_exit,
    libc::SYS_exit_group,
    // Clocks (timeouts, log timestamps) and sleeps.
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    // A sleep or wait interrupted by a stop (SIGSTOP, a debugger) resumes
    // through this; without it, `kill -STOP`/`-CONT` would end the VMM.
    libc::SYS_restart_syscall,
    // Logging to stderr (vmm.log) and the SIGSYS report.
    libc::SYS_write,
    libc::SYS_writev,
    // Random seeds (hash maps).
    libc::SYS_getrandom,
];

/// The vCPU threads: KVM_RUN and KVM state ioctls (XSAVE state for the
/// compat kernel, registers for snapshots), the serial console's file
/// writes, and kicks between threads.
const VCPU: &[i64] = &[
    libc::SYS_ioctl,
    libc::SYS_write,
    libc::SYS_tgkill,
    libc::SYS_close,
];

/// The device thread: epoll, disk I/O, vsock and network sockets, eventfds
/// and timers.
const DEVICES: &[i64] = &[
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_ctl,
    // Disk images.
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_fdatasync,
    libc::SYS_fsync,
    libc::SYS_fallocate,
    libc::SYS_lseek,
    // Vsock host connections (Unix sockets) and the network backend; a
    // guest's connection to a host port is a Unix stream socket connected
    // to that port's socket (its own or a service's relay), made here.
    libc::SYS_socket,
    libc::SYS_connect,
    libc::SYS_accept4,
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_close,
    libc::SYS_fcntl,
    libc::SYS_getsockopt,
    // Interrupt eventfds, timers.
    libc::SYS_ioctl,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
];

// The ioctl requests the threads make once the machine runs (the KVM ABI
// numbers, from the structures' sizes as the kernel's headers define them).
mod kvm_requests {
    #![allow(missing_docs)]
    use kvm_bindings::{
        kvm_clock_data, kvm_cpuid2, kvm_debugregs, kvm_ioeventfd, kvm_irqchip, kvm_irqfd,
        kvm_lapic_state, kvm_mp_state, kvm_msr_list, kvm_msrs, kvm_pit_state2, kvm_regs, kvm_sregs,
        kvm_vcpu_events, kvm_xcrs, kvm_xsave, KVMIO,
    };
    use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iow_nr, ioctl_iowr_nr};

    ioctl_iowr_nr!(KVM_GET_MSR_INDEX_LIST, KVMIO, 0x02, kvm_msr_list);
    ioctl_io_nr!(KVM_CHECK_EXTENSION, KVMIO, 0x03);
    ioctl_iowr_nr!(KVM_GET_SUPPORTED_CPUID, KVMIO, 0x05, kvm_cpuid2);
    ioctl_iowr_nr!(KVM_GET_IRQCHIP, KVMIO, 0x62, kvm_irqchip);
    ioctl_iow_nr!(KVM_IRQFD, KVMIO, 0x76, kvm_irqfd);
    ioctl_iow_nr!(KVM_IOEVENTFD, KVMIO, 0x79, kvm_ioeventfd);
    ioctl_iow_nr!(KVM_SET_CLOCK, KVMIO, 0x7b, kvm_clock_data);
    ioctl_ior_nr!(KVM_GET_CLOCK, KVMIO, 0x7c, kvm_clock_data);
    ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
    ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_regs);
    ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_sregs);
    ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_msrs);
    ioctl_ior_nr!(KVM_GET_LAPIC, KVMIO, 0x8e, kvm_lapic_state);
    ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_mp_state);
    ioctl_ior_nr!(KVM_GET_PIT2, KVMIO, 0x9f, kvm_pit_state2);
    ioctl_ior_nr!(KVM_GET_VCPU_EVENTS, KVMIO, 0x9f, kvm_vcpu_events);
    ioctl_ior_nr!(KVM_GET_DEBUGREGS, KVMIO, 0xa1, kvm_debugregs);
    ioctl_io_nr!(KVM_GET_TSC_KHZ, KVMIO, 0xa3);
    ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_xsave);
    ioctl_iow_nr!(KVM_SET_XSAVE, KVMIO, 0xa5, kvm_xsave);
    ioctl_ior_nr!(KVM_GET_XCRS, KVMIO, 0xa6, kvm_xcrs);
    ioctl_io_nr!(KVM_KVMCLOCK_CTRL, KVMIO, 0xad);
}
use kvm_requests::*;

/// vCPU threads: running the guest; the compat kernel's upper YMM halves
/// (XSAVE state); the registers a crash report or a timeout names.
fn vcpu_ioctls() -> Vec<u64> {
    vec![
        KVM_RUN(),
        KVM_GET_XSAVE(),
        KVM_SET_XSAVE(),
        KVM_GET_REGS(),
        KVM_GET_SREGS(),
    ]
}

/// The device thread: non-blocking mode for accepted vsock connections.
fn devices_ioctls() -> Vec<u64> {
    vec![libc::FIONBIO]
}

/// The machine's control operations, on whichever thread calls them:
/// snapshots read each vCPU's and the VM's state and record the host's KVM
/// facts, and reflink the disk; device interrupts and doorbells (irqfd,
/// ioeventfd) are wired as drivers come up; a pause tells each vCPU's
/// kvm-clock the guest was stopped, and its resume sets the VM's clock
/// back to where the pause stopped it. Nothing creates or maps, and of VM
/// state only the guest's own clock is set.
fn control_ioctls() -> Vec<u64> {
    vec![
        crate::disk_copy::FICLONE,
        KVM_CHECK_EXTENSION(),
        KVM_GET_MSR_INDEX_LIST(),
        KVM_GET_SUPPORTED_CPUID(),
        KVM_GET_TSC_KHZ(),
        KVM_GET_CLOCK(),
        KVM_SET_CLOCK(),
        KVM_GET_IRQCHIP(),
        KVM_GET_PIT2(),
        KVM_GET_REGS(),
        KVM_GET_SREGS(),
        KVM_GET_MSRS(),
        KVM_GET_LAPIC(),
        KVM_GET_MP_STATE(),
        KVM_GET_VCPU_EVENTS(),
        KVM_GET_DEBUGREGS(),
        KVM_GET_XSAVE(),
        KVM_GET_XCRS(),
        KVM_IRQFD(),
        KVM_IOEVENTFD(),
        KVM_KVMCLOCK_CTRL(),
    ]
}

/// The bits of `socket`'s type argument that name the type.
const SOCK_TYPE_MASK: u64 = 0xf;

/// The rules a role puts on syscalls' arguments: its ioctl requests, the
/// socket families, and `clone` for threads only (a new process would
/// start outside the filter's intent: no fork of a confined VMM).
fn argument_rules(role: ThreadRole, control: &ControlRole, peers: &Peers) -> Rules {
    let mut ioctls = match role {
        ThreadRole::Vcpu => vcpu_ioctls(),
        ThreadRole::Devices => devices_ioctls(),
        // Every thread has the control filter under its own: it lets
        // through what any role makes.
        ThreadRole::Control => [
            control.ioctls.to_vec(),
            control_ioctls(),
            vcpu_ioctls(),
            devices_ioctls(),
        ]
        .concat(),
    };
    ioctls.sort_unstable();
    ioctls.dedup();
    let mut rules = BTreeMap::new();
    // ioctl requests, prctl options and process ids are 32-bit in the
    // kernel: their low halves.
    let one_of = |index: u8, values: &[u64]| -> Vec<Vec<ArgIs>> {
        values
            .iter()
            .map(|&v| vec![ArgIs::equal(index, v)])
            .collect()
    };
    // Only the options the process uses: thread names (std), the check a
    // vCPU makes at its first run, no_new_privs before a thread stacks its
    // filter, and the C library's names of anonymous mappings.
    rules.insert(
        libc::SYS_prctl,
        one_of(
            0,
            &[
                libc::PR_SET_NAME as u64,
                libc::PR_GET_NAME as u64,
                libc::PR_GET_SECCOMP as u64,
                libc::PR_SET_NO_NEW_PRIVS as u64,
                libc::PR_SET_VMA as u64,
            ],
        ),
    );
    // Signals only to its own threads (vCPU kicks) and, with `kill`, to
    // itself and the children it made (passt).
    rules.insert(libc::SYS_tgkill, one_of(0, &[peers.own as u64]));
    let mut killable = vec![peers.own as u64];
    killable.extend(peers.children.iter().map(|&c| c as u64));
    rules.insert(libc::SYS_kill, one_of(0, &killable));
    // Its own limits only (0 is the caller).
    rules.insert(libc::SYS_prlimit64, one_of(0, &[0, peers.own as u64]));
    rules.insert(libc::SYS_ioctl, one_of(1, &ioctls));
    if role == ThreadRole::Devices {
        // Unix stream sockets only (a guest's connection to a host port).
        rules.insert(
            libc::SYS_socket,
            vec![socket_rule(libc::AF_UNIX, libc::SOCK_STREAM)],
        );
    }
    if role == ThreadRole::Control {
        // Its families, and only its types of them: never a raw or packet
        // socket (the type's low bits; the CLOEXEC and NONBLOCK flags above
        // them pass).
        let mut sockets = Vec::new();
        for &family in control.socket_families {
            for &kind in control.socket_types {
                sockets.push(socket_rule(family, kind));
            }
        }
        rules.insert(libc::SYS_socket, sockets);
        let thread = libc::CLONE_THREAD as u64;
        rules.insert(
            libc::SYS_clone,
            vec![vec![ArgIs {
                index: 0,
                width: Width::Full64,
                mask: thread,
                value: thread,
            }]],
        );
    }
    rules
}

/// `socket` of `family` and `kind` (the type's low bits; the CLOEXEC and
/// NONBLOCK flags above them pass).
fn socket_rule(family: i32, kind: i32) -> Vec<ArgIs> {
    vec![
        ArgIs::equal(0, family as u64),
        ArgIs::masked(1, SOCK_TYPE_MASK, kind as u64),
    ]
}

/// The syscalls `role`'s threads may make (`extra` beside every thread's),
/// with the rules on their arguments.
fn rules_of(role: ThreadRole, extra: &[i64], control: &ControlRole, peers: &Peers) -> Rules {
    let mut rules: Rules = EVERY_THREAD
        .iter()
        .chain(extra)
        .map(|&nr| (nr, Vec::new()))
        .collect();
    for (nr, conditions) in argument_rules(role, control, peers) {
        if rules.contains_key(&nr) {
            rules.insert(nr, conditions);
        }
    }
    rules
}

fn build(
    role: ThreadRole,
    extra: &[i64],
    control: &ControlRole,
    peers: &Peers,
) -> Result<BpfProgram, SeccompError> {
    program::compile(rules_of(role, extra, control, peers)).map_err(|source| SeccompError::Build {
        role: role.name(),
        source,
    })
}

/// `clone3` passes its flags in memory, which a filter cannot read: it
/// fails with ENOSYS instead, and the C library starts threads with
/// `clone`, whose flags the control filter checks. The check goes before
/// `program` rather than in a filter of its own: one filter to install
/// (each is checked and compiled by the kernel as it is installed, on the
/// restore's path) and to run at every syscall. Classic BPF jumps are
/// relative and only forward, so `program` runs as it did after it; a
/// syscall of another architecture reaches its architecture check.
fn with_clone3_unavailable(program: BpfProgram) -> Result<BpfProgram, SeccompError> {
    use program::{step, ARCH, AUDIT_ARCH_X86_64, JUMP_IF_EQUAL, LOAD_WORD, NR, RETURN};
    let mut merged = vec![
        step(LOAD_WORD, 0, 0, ARCH),
        // Another architecture: on to `program`'s own check.
        step(JUMP_IF_EQUAL, 0, 3, AUDIT_ARCH_X86_64),
        step(LOAD_WORD, 0, 0, NR),
        step(JUMP_IF_EQUAL, 0, 1, libc::SYS_clone3 as u32),
        step(
            RETURN,
            0,
            0,
            libc::SECCOMP_RET_ERRNO | (libc::ENOSYS as u32 & libc::SECCOMP_RET_DATA),
        ),
    ];
    merged.extend(program);
    // Refused here, where the filters are made, not when the kernel is
    // given it on a restore's path.
    if merged.len() > MAX_INSTRUCTIONS {
        return Err(SeccompError::TooLong {
            role: "control",
            length: merged.len(),
        });
    }
    Ok(merged)
}

/// The compiled filters, for the roles' threads to install.
#[derive(Debug)]
pub struct Filters {
    vcpu: BpfProgram,
    devices: BpfProgram,
    control: BpfProgram,
    /// Who the control threads may signal.
    peers: Peers,
}

/// The processes a confined process may signal: itself and its children.
#[derive(Clone, Debug)]
struct Peers {
    own: u32,
    children: Vec<u32>,
}

impl Filters {
    /// Compiles every role's filter, the control threads' from `control`,
    /// for the calling process with no children to signal.
    pub fn new(control: &ControlRole) -> Result<Self, SeccompError> {
        Self::with_children(control, &[])
    }

    /// The same, letting the control threads signal `children` (processes
    /// this one started, such as passt) besides itself.
    pub fn with_children(control: &ControlRole, children: &[u32]) -> Result<Self, SeccompError> {
        let peers = Peers {
            own: std::process::id(),
            children: children.to_vec(),
        };
        Ok(Self {
            vcpu: build(ThreadRole::Vcpu, VCPU, control, &peers)?,
            devices: build(ThreadRole::Devices, DEVICES, control, &peers)?,
            control: with_clone3_unavailable(build(
                ThreadRole::Control,
                control.syscalls,
                control,
                &peers,
            )?)?,
            peers,
        })
    }

    /// Whether these filters, made earlier (by a process waiting for its
    /// workspace), are the ones [`Filters::with_children`] would make now
    /// for `children`: the same process and the same children, in any
    /// order.
    pub fn made_for(&self, children: &[u32]) -> bool {
        let sorted = |c: &[u32]| {
            let mut c = c.to_vec();
            c.sort_unstable();
            c.dedup();
            c
        };
        self.peers.own == std::process::id() && sorted(&self.peers.children) == sorted(children)
    }

    fn program(&self, role: ThreadRole) -> &BpfProgram {
        match role {
            ThreadRole::Vcpu => &self.vcpu,
            ThreadRole::Devices => &self.devices,
            ThreadRole::Control => &self.control,
        }
    }
}

/// The filters of this process once confinement began.
static ACTIVE: OnceLock<Filters> = OnceLock::new();

/// Confines the whole process: the SIGSYS handler, then the `control`
/// filter on every thread (TSYNC, with no_new_privs); from then on the
/// vCPU and device threads add their own at their start
/// ([`enter`]). Call once the machine is built and before it runs.
pub fn confine_process(filters: Filters) -> Result<(), SeccompError> {
    install_sigsys_handler()?;
    let filters = ACTIVE.get_or_init(|| filters);
    seccompiler::apply_filter_all_threads(filters.program(ThreadRole::Control)).map_err(|source| {
        SeccompError::Install {
            role: "control",
            source,
        }
    })
}

/// Whether [`confine_process`] ran.
pub fn active() -> bool {
    ACTIVE.get().is_some()
}

/// Installs `role`'s filter on the calling thread if the process is
/// confined (nothing otherwise: tiny test guests, `vmm boot`).
pub fn enter(role: ThreadRole) -> Result<(), SeccompError> {
    ROLE.with(|r| r.set(role.name()));
    let Some(filters) = ACTIVE.get() else {
        return Ok(());
    };
    if role == ThreadRole::Control {
        return Ok(());
    }
    seccompiler::apply_filter(filters.program(role)).map_err(|source| SeccompError::Install {
        role: role.name(),
        source,
    })
}

thread_local! {
    /// The calling thread's role, for the SIGSYS report.
    static ROLE: std::cell::Cell<&'static str> = const { std::cell::Cell::new("control") };
}

fn install_sigsys_handler() -> Result<(), SeccompError> {
    // SAFETY: an all-zero sigaction is valid; the fields are set below.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigsys as *const () as usize;
    action.sa_flags = libc::SA_SIGINFO;
    // SAFETY: `action` is a valid sigaction whose handler is async-signal
    // safe (it only formats into a stack buffer, writes and exits).
    if unsafe { libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) } != 0 {
        return Err(SeccompError::Handler(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Reports the refused syscall on stderr and ends the process.
extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // The syscall number is si_syscall: the int after si_call_addr, the
    // pointer that starts the siginfo union at offset 16 (so at 24).
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers;
    // for SIGSYS from seccomp the union holds _sigsys.
    let nr = unsafe { *info.cast::<u8>().add(24).cast::<libc::c_int>() };
    let role = ROLE.with(|r| r.get());
    let mut buf = [0u8; 160];
    let mut len = 0;
    let mut push = |part: &[u8], len: &mut usize| {
        let n = part.len().min(buf.len() - *len);
        buf[*len..*len + n].copy_from_slice(&part[..n]);
        *len += n;
    };
    push(VIOLATION_PREFIX.as_bytes(), &mut len);
    push(b" the ", &mut len);
    push(role.as_bytes(), &mut len);
    push(b" thread made syscall ", &mut len);
    let mut digits = [0u8; 12];
    let n = format_decimal(nr, &mut digits);
    push(&digits[..n], &mut len);
    // Its first two arguments (an ioctl's request, a socket's family, a
    // clone's flags) say which use of it was refused.
    // SAFETY: for SA_SIGINFO handlers the third argument is the interrupted
    // thread's ucontext, whose registers hold the syscall's arguments.
    let (arg0, arg1) = unsafe {
        let regs = &(*context.cast::<libc::ucontext_t>()).uc_mcontext.gregs;
        (
            regs[libc::REG_RDI as usize] as u64,
            regs[libc::REG_RSI as usize] as u64,
        )
    };
    let mut hex = [0u8; 18];
    push(b" (arguments ", &mut len);
    let n = format_hex(arg0, &mut hex);
    push(&hex[..n], &mut len);
    push(b", ", &mut len);
    let n = format_hex(arg1, &mut hex);
    push(&hex[..n], &mut len);
    push(b"), outside its filter\n", &mut len);
    // SAFETY: write and _exit are async-signal safe and in every filter.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), len);
        libc::_exit(SECCOMP_EXIT_CODE);
    }
}

/// Writes `n` as `0x` and lowercase hex digits into `out`; returns the
/// bytes written.
fn format_hex(n: u64, out: &mut [u8; 18]) -> usize {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out[0] = b'0';
    out[1] = b'x';
    let digits = (16 - n.leading_zeros() as usize / 4).max(1);
    for i in 0..digits {
        out[2 + i] = DIGITS[((n >> (4 * (digits - 1 - i))) & 0xf) as usize];
    }
    2 + digits
}

/// Writes `n` in decimal into `out`; returns the digits written.
fn format_decimal(n: libc::c_int, out: &mut [u8]) -> usize {
    let mut digits = [0u8; 12];
    let mut i = digits.len();
    let negative = n < 0;
    let mut v = i64::from(n).unsigned_abs();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if negative {
        i -= 1;
        digits[i] = b'-';
    }
    let n = (digits.len() - i).min(out.len());
    out[..n].copy_from_slice(&digits[i..i + n]);
    n
}

#[cfg(test)]
mod tests;
