//! The seccomp matrix of the shipped VMM filters (as Firecracker's
//! `test_seccomp`): for each thread role, syscalls outside its list, and
//! argument negatives inside it (`socket` of a family the control threads
//! do not use, a raw socket, an ioctl that is not KVM's, `clone` without
//! `CLONE_THREAD`, `kill` or `prlimit64` of another process, a `prctl`
//! option it does not use), each end the process with the seccomp exit status and
//! the report line naming the role and the syscall. Each case runs in a
//! child process of this test binary, confined by `vmm_host::seccomp::CONTROL`.
//! And a tiny machine run so confined reports that its vCPU thread had
//! its filter before the guest's first instruction.

use vmm_core::seccomp::{
    confine_process, enter, Filters, ThreadRole, SECCOMP_EXIT_CODE, VIOLATION_PREFIX,
};

/// The variable that makes the child run one case: `ROLE,NR,A0,A1`.
const CASE: &str = "MICROAGENT_SECCOMP_MATRIX_CASE";
/// The variable that makes the child run a tiny machine confined: its
/// scratch directory.
const MACHINE: &str = "MICROAGENT_SECCOMP_MATRIX_MACHINE";

/// TIOCGWINSZ: an ioctl request that is not KVM's.
const NOT_KVM_IOCTL: u64 = 0x5413;

/// (role, syscall, first two arguments) that must each be refused.
fn cases() -> Vec<(&'static str, i64, u64, u64)> {
    let mut cases = Vec::new();
    for role in ["vcpu", "devices"] {
        for nr in [
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_clone,
            libc::SYS_mount,
            libc::SYS_ptrace,
            libc::SYS_kill,
        ] {
            cases.push((role, nr, 0, 0));
        }
        cases.push((role, libc::SYS_ioctl, 0, NOT_KVM_IOCTL));
    }
    cases.push((
        "vcpu",
        libc::SYS_socket,
        libc::AF_UNIX as u64,
        libc::SOCK_STREAM as u64,
    ));
    cases.extend([
        (
            "control",
            libc::SYS_socket,
            libc::AF_INET as u64,
            libc::SOCK_RAW as u64,
        ),
        (
            "control",
            libc::SYS_socket,
            libc::AF_NETLINK as u64,
            libc::SOCK_RAW as u64,
        ),
        (
            "control",
            libc::SYS_socket,
            libc::AF_PACKET as u64,
            libc::SOCK_RAW as u64,
        ),
        ("control", libc::SYS_clone, libc::SIGCHLD as u64, 0),
        ("control", libc::SYS_ioctl, 0, NOT_KVM_IOCTL),
        ("control", libc::SYS_execve, 0, 0),
        ("control", libc::SYS_mount, 0, 0),
        ("control", libc::SYS_ptrace, 0, 0),
        ("control", libc::SYS_setuid, 0, 0),
        ("control", libc::SYS_bpf, 0, 0),
        ("control", libc::SYS_init_module, 0, 0),
        // Internet sockets (listeners are handed over), signals and limits
        // of another process (pid 1: never this one nor a child it made),
        // prctl options it does not use.
        (
            "control",
            libc::SYS_socket,
            libc::AF_INET as u64,
            libc::SOCK_STREAM as u64,
        ),
        (
            "control",
            libc::SYS_socket,
            libc::AF_INET6 as u64,
            libc::SOCK_DGRAM as u64,
        ),
        (
            "control",
            libc::SYS_socket,
            libc::AF_UNIX as u64,
            libc::SOCK_DGRAM as u64,
        ),
        ("control", libc::SYS_kill, 1, 0),
        ("control", libc::SYS_tgkill, 1, 1),
        ("control", libc::SYS_prlimit64, 1, 0),
        ("control", libc::SYS_pidfd_open, 1, 0),
        ("control", libc::SYS_prctl, libc::PR_SET_DUMPABLE as u64, 1),
        (
            "control",
            libc::SYS_prctl,
            libc::PR_SET_SECUREBITS as u64,
            0,
        ),
        ("vcpu", libc::SYS_tgkill, 1, 1),
        ("vcpu", libc::SYS_prctl, libc::PR_SET_DUMPABLE as u64, 1),
    ]);
    cases
}

/// Run in a child process by the test below: confines itself as the VMM
/// does and makes the case's syscall in a thread of the case's role.
#[test]
#[ignore = "run in a child process by the matrix test"]
fn matrix_child() {
    let Some(case) = std::env::var_os(CASE) else {
        return;
    };
    let case = case.to_string_lossy().into_owned();
    let parts: Vec<&str> = case.split(',').collect();
    let (role, nr, a0, a1) = (
        parts[0].to_owned(),
        parts[1].parse::<i64>().unwrap(),
        parts[2].parse::<u64>().unwrap(),
        parts[3].parse::<u64>().unwrap(),
    );
    confine_process(Filters::new(&vmm_host::seccomp::CONTROL).unwrap()).unwrap();
    let call = move || {
        // SAFETY: the filter ends the process before the kernel runs the
        // call; were it let through, null pointers make it fail (EFAULT).
        unsafe { libc::syscall(nr, a0, a1, 0u64, 0u64, 0u64, 0u64) };
    };
    match role.as_str() {
        "control" => call(),
        other => {
            let role = if other == "vcpu" {
                ThreadRole::Vcpu
            } else {
                ThreadRole::Devices
            };
            std::thread::spawn(move || {
                enter(role).unwrap();
                call();
            })
            .join()
            .unwrap();
        }
    }
    // Reached only when the filter let the call through (the parent sees
    // a status other than the filter's).
    panic!("the filter let syscall {nr} through");
}

#[test]
fn every_role_is_refused_what_it_does_not_make() {
    let mut failures = Vec::new();
    for (role, nr, a0, a1) in cases() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "matrix_child", "--nocapture"])
            .env(CASE, format!("{role},{nr},{a0},{a1}"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let line = format!("{VIOLATION_PREFIX} the {role} thread made syscall {nr} ");
        if out.status.code() != Some(SECCOMP_EXIT_CODE) || !stderr.contains(&line) {
            failures.push(format!(
                "{role} syscall {nr} ({a0:#x}, {a1:#x}): status {:?}, stderr: {}",
                out.status.code(),
                stderr.lines().last().unwrap_or("")
            ));
        }
    }
    assert!(failures.is_empty(), "let through:\n{}", failures.join("\n"));
}

/// A tiny machine whose guest spins (`jmp $`) for `for_ms`, built in
/// `dir`; its outcome.
fn run_tiny(dir: &std::path::Path, confine: bool, for_ms: u64) -> vmm_core::RunOutcome {
    use vmm_core::devices::serial::ConsoleSink;
    use vmm_core::tiny::{asm, elf_kernel};
    use vmm_core::{CpuTemplate, Machine, MachineConfig};
    let kernel = dir.join("spin.elf");
    std::fs::write(&kernel, elf_kernel(&asm::jmp_back(0, 0))).unwrap();
    let machine = Machine::build(MachineConfig {
        kernel,
        initrd: None,
        extra_cmdline: None,
        mem_mib: 32,
        vcpus: 1,
        template: CpuTemplate::Standard,
        console: ConsoleSink::new(),
        disks: Vec::new(),
        vsock: None,
        net: None,
        balloon: false,
    })
    .unwrap();
    if confine {
        confine_process(Filters::new(&vmm_host::seccomp::CONTROL).unwrap()).unwrap();
    }
    machine
        .run(Some(std::time::Duration::from_millis(for_ms)))
        .unwrap()
}

/// Run in a child process by the test below: a tiny machine in a process
/// confined as the VMM is.
#[test]
#[ignore = "run in a child process by the first-instruction test"]
fn confined_machine_child() {
    let Some(dir) = std::env::var_os(MACHINE) else {
        return;
    };
    let outcome = run_tiny(std::path::Path::new(&dir), true, 300);
    assert_eq!(outcome.first_run_confined, Some(true), "{outcome:?}");
}

/// The vCPU thread is under its filter before the guest's first
/// instruction (it says so at its first KVM_RUN); an unconfined run says it
/// was not, so the report can tell.
#[test]
fn the_vcpu_filter_is_in_place_before_the_first_guest_instruction() {
    let test = "the_vcpu_filter_is_in_place_before_the_first_guest_instruction";
    if testkit::require(test, testkit::kvm()).is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("ma-seccomp-first-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unconfined = run_tiny(&dir, false, 100);
    assert_eq!(unconfined.first_run_confined, Some(false), "{unconfined:?}");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "confined_machine_child",
            "--nocapture",
        ])
        .env(MACHINE, &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
}

/// The variable that makes the child sleep confined.
const STOPPED: &str = "MICROAGENT_SECCOMP_MATRIX_STOPPED";

/// Run in a child process by the test below: sleeps under the control
/// filter, the way the VMM's timers do.
#[test]
#[ignore = "run in a child process by the stop-and-continue test"]
fn sleeping_child() {
    if std::env::var_os(STOPPED).is_none() {
        return;
    }
    confine_process(Filters::new(&vmm_host::seccomp::CONTROL).unwrap()).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
}

/// A confined process stopped and continued (`kill -STOP`, `-CONT`, a
/// debugger attaching) resumes its sleep through `restart_syscall`; the
/// filter must let it, or a paused VMM dies when continued.
#[test]
fn a_confined_process_survives_stop_and_continue() {
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "sleeping_child", "--nocapture"])
        .env(STOPPED, "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    std::thread::sleep(std::time::Duration::from_millis(800));
    for signal in [libc::SIGSTOP, libc::SIGCONT] {
        // SAFETY: kill(2) on our own child, which has not been reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
