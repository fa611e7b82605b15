//! What the workspace VMM's control threads may do under seccomp: the
//! control socket, the agent link, published ports (TCP listeners and
//! their tunnels over the vsock socket), the event and console logs,
//! snapshots and disk copies, TTL, signals and the end of the run. The
//! machine's own filters (vCPU and device threads) and the KVM requests of
//! its control operations are vmm-core's; this list is the rest.
//!
//! Measured as vmm-core's lists were (strace of whole workspace life
//! cycles); the real-guest tests run under the filters and catch a missing
//! syscall.

use vmm_core::seccomp::ControlRole;

/// The control threads' role, for [`vmm_core::seccomp::Filters::new`].
pub const CONTROL: ControlRole = ControlRole {
    syscalls: CONTROL_SYSCALLS,
    // Sockets made non-blocking.
    ioctls: &[libc::FIONBIO],
    // Unix sockets only (the agent, the guest's connections to host
    // sockets): published ports' TCP listeners are bound before the
    // lockdown or by the library, which sends them over the control
    // socket. No internet, netlink, packet or other family.
    socket_families: &[libc::AF_UNIX],
    // Stream and seqpacket only: no datagram socket to send from.
    socket_types: &[libc::SOCK_STREAM, libc::SOCK_SEQPACKET],
};

/// Everything the control threads do after the machine is built.
const CONTROL_SYSCALLS: &[i64] = &[
    // Files: metadata, event log, console log, snapshots, disk copies.
    libc::SYS_openat,
    libc::SYS_close,
    libc::SYS_read,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_readv,
    libc::SYS_lseek,
    libc::SYS_newfstatat,
    libc::SYS_fstat,
    libc::SYS_statx,
    // A hibernation's check of the free space for its memory file.
    libc::SYS_statfs,
    libc::SYS_getdents64,
    libc::SYS_readlink,
    libc::SYS_access,
    libc::SYS_fcntl,
    libc::SYS_flock,
    libc::SYS_ftruncate,
    libc::SYS_fallocate,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_rmdir,
    libc::SYS_chmod,
    libc::SYS_fchmod,
    libc::SYS_copy_file_range,
    libc::SYS_sendfile,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_pipe2,
    libc::SYS_eventfd2,
    // The control socket, the agent link, published ports (listeners
    // handed over, and their tunnels over the vsock socket). No `bind` or
    // `listen`: every listener is bound before the lockdown or handed over.
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    // KVM: pausing and snapshotting vCPUs and devices, ioeventfds.
    libc::SYS_ioctl,
    // New threads (port tunnels, the stop sequence) and their ends.
    libc::SYS_clone,
    libc::SYS_clone3,
    // vCPU and device threads stack their own filter as they start (a
    // filter can only be narrowed, never lifted).
    libc::SYS_seccomp,
    // Signals: termination signals, vCPU kicks, passt's end (`kill`,
    // `tgkill` and `prlimit64` only on itself and its children: vmm-core's
    // argument rules).
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_tgkill,
    libc::SYS_kill,
    libc::SYS_wait4,
    libc::SYS_waitid,
    // Process facts: /proc reads go through openat; ids for logs.
    libc::SYS_geteuid,
    libc::SYS_getuid,
    libc::SYS_getegid,
    libc::SYS_getgid,
    libc::SYS_prlimit64,
    libc::SYS_uname,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_threads_cannot_start_programs_change_mounts_or_listen() {
        for nr in [
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_ptrace,
            libc::SYS_mount,
            libc::SYS_bind,
            libc::SYS_listen,
        ] {
            assert!(!CONTROL.syscalls.contains(&nr), "{nr}");
        }
    }

    #[test]
    fn the_filters_compile_with_this_list() {
        vmm_core::seccomp::Filters::new(&CONTROL).unwrap();
    }
}
