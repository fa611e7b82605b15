//! The filters compiled, and run in child processes of this test binary.

use super::*;

/// Control threads that start threads and open Unix sockets, as the
/// tests below need.
const TEST_CONTROL: ControlRole = ControlRole {
    syscalls: &[
        libc::SYS_clone,
        libc::SYS_clone3,
        libc::SYS_socket,
        libc::SYS_close,
        libc::SYS_rt_sigaction,
        libc::SYS_seccomp,
        libc::SYS_openat,
        libc::SYS_read,
        libc::SYS_fstat,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_poll,
        libc::SYS_ppoll,
        libc::SYS_fcntl,
        libc::SYS_ioctl,
    ],
    ioctls: &[],
    socket_families: &[libc::AF_UNIX],
    socket_types: &[libc::SOCK_STREAM],
};

#[test]
fn every_filter_compiles() {
    let f = Filters::new(&TEST_CONTROL).unwrap();
    for role in [ThreadRole::Vcpu, ThreadRole::Devices, ThreadRole::Control] {
        assert!(!f.program(role).is_empty());
    }
}

/// Run by [`a_syscall_outside_the_filter_ends_the_process_with_a_report`]
/// in a child process of this test binary (it never returns there).
#[test]
#[ignore = "run in a child process by the test below"]
fn confined_child() {
    if std::env::var_os("MICROAGENT_SECCOMP_CHILD").is_none() {
        return;
    }
    confine_process(Filters::new(&TEST_CONTROL).unwrap()).unwrap();
    let vcpu = std::thread::spawn(|| {
        enter(ThreadRole::Vcpu).unwrap();
        // Allowed: memory and a console write.
        let v = vec![1u8; 1 << 20];
        assert_eq!(v.len(), 1 << 20);
        // Not allowed for a vCPU thread: a socket.
        // SAFETY: socket() takes no pointers.
        unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
    });
    let _ = vcpu.join();
    unreachable!("the filter let a vCPU thread open a socket");
}

/// Runs the ignored test `name` in a child process with `var` set;
/// checks that its filter ended it and returns its stderr.
fn run_confined_child(name: &str, var: &str) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            &format!("seccomp::tests::{name}"),
            "--nocapture",
        ])
        .env(var, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(SECCOMP_EXIT_CODE), "{stderr}");
    stderr
}

#[test]
fn a_syscall_outside_the_filter_ends_the_process_with_a_report() {
    let stderr = run_confined_child("confined_child", "MICROAGENT_SECCOMP_CHILD");
    let line = format!(
        "{VIOLATION_PREFIX} the vcpu thread made syscall {} (arguments 0x{:x}, 0x{:x}), outside its filter",
        libc::SYS_socket,
        libc::AF_UNIX,
        libc::SOCK_STREAM
    );
    assert!(stderr.contains(&line), "{stderr}");
}

/// Run by [`the_devices_thread_opens_unix_stream_sockets_only`] in a
/// child process.
#[test]
#[ignore = "run in a child process by the test below"]
fn confined_devices_child() {
    if std::env::var_os("MICROAGENT_SECCOMP_DEVICES_CHILD").is_none() {
        return;
    }
    confine_process(Filters::new(&TEST_CONTROL).unwrap()).unwrap();
    let devices = std::thread::spawn(|| {
        enter(ThreadRole::Devices).unwrap();
        // SAFETY: socket() takes no pointers; the descriptor is closed.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0, "a Unix stream socket was refused");
        // SAFETY: a descriptor this thread owns.
        unsafe { libc::close(fd) };
        // SAFETY: as above; the filter ends the process here.
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    });
    let _ = devices.join();
    unreachable!("the filter let the device thread open an internet socket");
}

#[test]
fn the_devices_thread_opens_unix_stream_sockets_only() {
    let stderr = run_confined_child("confined_devices_child", "MICROAGENT_SECCOMP_DEVICES_CHILD");
    let line = format!(
        "{VIOLATION_PREFIX} the devices thread made syscall {} (arguments 0x{:x}, 0x{:x}), outside its filter",
        libc::SYS_socket,
        libc::AF_INET,
        libc::SOCK_STREAM
    );
    assert!(stderr.contains(&line), "{stderr}");
}

/// Run by [`the_control_filter_checks_arguments`] in a child process.
#[test]
#[ignore = "run in a child process by the test below"]
fn confined_control_child() {
    if std::env::var_os("MICROAGENT_SECCOMP_CONTROL_CHILD").is_none() {
        return;
    }
    confine_process(Filters::new(&TEST_CONTROL).unwrap()).unwrap();
    // Threads still start (clone3 fails with ENOSYS; the C library
    // falls back to clone with CLONE_THREAD), and Unix sockets open.
    let t = std::thread::spawn(|| 7);
    assert_eq!(t.join().unwrap(), 7);
    // SAFETY: clone3 with no arguments structure fails before it reads.
    let rc = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOSYS)
    );
    // SAFETY: socket() takes no pointers; the descriptor is closed.
    let unix = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(unix >= 0);
    // SAFETY: `unix` is ours and open.
    unsafe { libc::close(unix) };
    // A netlink socket is not a family the control threads use.
    // SAFETY: socket() takes no pointers.
    unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) };
    unreachable!("the filter let a control thread open a netlink socket");
}

#[test]
fn the_control_filter_checks_arguments() {
    let stderr = run_confined_child("confined_control_child", "MICROAGENT_SECCOMP_CONTROL_CHILD");
    let line = format!(
        "{VIOLATION_PREFIX} the control thread made syscall {} (arguments 0x{:x}, 0x{:x}), outside its filter",
        libc::SYS_socket,
        libc::AF_NETLINK,
        libc::SOCK_RAW
    );
    assert!(stderr.contains(&line), "{stderr}");
}

#[test]
fn ioctl_requests_are_the_kernels() {
    // From <linux/kvm.h> on x86_64, as `strace -X raw` prints them.
    assert_eq!(KVM_RUN(), 0xae80);
    assert_eq!(KVM_GET_REGS(), 0x8090_ae81);
    assert_eq!(KVM_GET_SREGS(), 0x8138_ae83);
    assert_eq!(KVM_GET_XSAVE(), 0x9000_aea4);
    assert_eq!(KVM_SET_XSAVE(), 0x5000_aea5);
    assert_eq!(KVM_IRQFD(), 0x4020_ae76);
    assert_eq!(KVM_IOEVENTFD(), 0x4040_ae79);
    assert_eq!(KVM_CHECK_EXTENSION(), 0xae03);
    assert_eq!(KVM_KVMCLOCK_CTRL(), 0xaead);
    assert_eq!(KVM_GET_CLOCK(), 0x8030_ae7c);
    assert_eq!(KVM_SET_CLOCK(), 0x4030_ae7b);
    // Setting the clock is the control role's (a resume), not a vCPU's.
    assert!(!vcpu_ioctls().contains(&KVM_SET_CLOCK()));
    // The vCPU threads cannot create, map or set VM state.
    for forbidden in [0xae01u64, 0x4020_ae46, 0x4090_ae82] {
        assert!(!vcpu_ioctls().contains(&forbidden));
        assert!(!control_ioctls().contains(&forbidden));
    }
}

#[test]
fn numbers_are_written_in_hex() {
    let mut out = [0u8; 18];
    let n = format_hex(0, &mut out);
    assert_eq!(&out[..n], b"0x0");
    let n = format_hex(0xae80, &mut out);
    assert_eq!(&out[..n], b"0xae80");
    let n = format_hex(u64::MAX, &mut out);
    assert_eq!(&out[..n], b"0xffffffffffffffff");
}

#[test]
fn numbers_are_written_in_decimal() {
    let mut out = [0u8; 12];
    let n = format_decimal(59, &mut out);
    assert_eq!(&out[..n], b"59");
    let n = format_decimal(-1, &mut out);
    assert_eq!(&out[..n], b"-1");
    let n = format_decimal(0, &mut out);
    assert_eq!(&out[..n], b"0");
}

#[test]
fn the_narrow_roles_cannot_start_programs_or_open_files() {
    for list in [VCPU, DEVICES] {
        for nr in [
            libc::SYS_execve,
            libc::SYS_openat,
            libc::SYS_clone,
            libc::SYS_bind,
            libc::SYS_listen,
        ] {
            assert!(!list.contains(&nr) && !EVERY_THREAD.contains(&nr), "{nr}");
        }
    }
    // Only the device thread connects (a guest's connection to a host
    // port), and its sockets are Unix stream sockets (the test below).
    assert!(!VCPU.contains(&libc::SYS_socket) && !EVERY_THREAD.contains(&libc::SYS_socket));
}

#[test]
fn a_program_too_long_with_its_prefix_is_refused_when_made() {
    let step = seccompiler::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0x7fff_0000,
    };
    let fits = with_clone3_unavailable(vec![step.clone(); MAX_INSTRUCTIONS - 5]).unwrap();
    assert_eq!(fits.len(), MAX_INSTRUCTIONS);
    assert!(matches!(
        with_clone3_unavailable(vec![step; MAX_INSTRUCTIONS - 4]),
        Err(SeccompError::TooLong { length: 4097, .. })
    ));
}

/// A control role that lists most syscalls, so every shape of the tree
/// (deep, leaves of rules beside leaves of plain syscalls) is exercised.
const WIDE_CONTROL: ControlRole = ControlRole {
    syscalls: &WIDE_SYSCALLS,
    ioctls: &[libc::FIONBIO, libc::TIOCGWINSZ],
    socket_families: &[libc::AF_UNIX, libc::AF_INET],
    socket_types: &[libc::SOCK_STREAM, libc::SOCK_SEQPACKET],
};

const WIDE_SYSCALLS: [i64; 300] = {
    let mut all = [0i64; 300];
    let mut i = 0;
    while i < 300 {
        // Every third number from 0, and everything from 200 on.
        all[i] = if i < 100 {
            3 * i as i64
        } else {
            i as i64 + 100
        };
        i += 1;
    }
    all
};

#[test]
fn every_roles_program_decides_as_seccompilers_chain_of_its_rules() {
    let peers = Peers {
        own: 4242,
        children: vec![4243, 77_777],
    };
    for control in [&TEST_CONTROL, &WIDE_CONTROL] {
        for (role, extra) in [
            (ThreadRole::Vcpu, VCPU),
            (ThreadRole::Devices, DEVICES),
            (ThreadRole::Control, control.syscalls),
        ] {
            let rules = rules_of(role, extra, control, &peers);
            let short = program::compile(rules.clone()).unwrap();
            let reference = program::tests::chain(&rules);
            program::tests::assert_same(&rules, &short, &reference);
            assert!(short.len() < reference.len(), "{role:?}");
        }
    }
}

#[test]
fn filters_made_ahead_serve_only_the_same_children() {
    let made = Filters::with_children(&TEST_CONTROL, &[30, 20]).unwrap();
    assert!(made.made_for(&[20, 30]));
    assert!(!made.made_for(&[20]));
    assert!(!made.made_for(&[20, 30, 40]));
    assert!(!made.made_for(&[]));
    assert!(Filters::new(&TEST_CONTROL).unwrap().made_for(&[]));
}
