//! Starting a VMM process: a `clone` of the calling thread sharing its
//! memory until the child execs (what `posix_spawn` does, so a restore's
//! launch stays fast whatever the starter's size), in a PID namespace of
//! its own when the starter may make one (`CAP_SYS_ADMIN`). There the VMM
//! is process 1: it sees no other process of the host, and when it ends
//! the kernel ends whatever it started (passt). The starter records the
//! pid `clone` returns, the VMM's pid on the host.
//!
//! The child gets `/dev/null` on stdin and stdout, the given log on
//! stderr, and, when the workspace lives for an owner process, a pidfd of
//! that owner as descriptor [`OWNER_FD`]: a VMM in a PID namespace of its
//! own could not name its owner to open one.

use std::ffi::{CString, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The descriptor the owner's pidfd has in the VMM process.
pub const OWNER_FD: i32 = 3;

/// The child's stack: it runs only until `execve`, in the code below.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// Why a VMM process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// An argument, the program's path or the environment has a NUL byte.
    #[error("an argument of the VMM process has a NUL byte")]
    NulByte,
    /// `/dev/null` could not be opened.
    #[error("opening /dev/null")]
    DevNull(#[source] std::io::Error),
    /// `clone` failed.
    #[error("creating the process")]
    Clone(#[source] std::io::Error),
    /// The child could not run the program.
    #[error("running {program}")]
    Exec {
        /// The program.
        program: String,
        /// What `execve` (or the descriptor set-up before it) said.
        #[source]
        source: std::io::Error,
    },
}

/// A started VMM process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spawned {
    /// Its pid on the host.
    pub pid: u32,
    /// Whether it has a PID namespace of its own.
    pub own_pid_namespace: bool,
}

/// What the child reads (and writes `errno` into) while it shares the
/// starter's memory.
struct ChildPlan {
    program: CString,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    null: i32,
    log: i32,
    owner: i32,
    errno: i32,
}

/// Starts `program` with `args` (after its name), stderr to `log`, the
/// owner's pidfd as [`OWNER_FD`] when given.
pub fn spawn(
    program: &Path,
    args: &[OsString],
    log: &File,
    owner: Option<&OwnedFd>,
) -> Result<Spawned, SpawnError> {
    let c = |bytes: &[u8]| CString::new(bytes).map_err(|_| SpawnError::NulByte);
    let program_c = c(program.as_os_str().as_bytes())?;
    let argv_c: Vec<CString> = std::iter::once(Ok(program_c.clone()))
        .chain(args.iter().map(|a| c(a.as_bytes())))
        .collect::<Result<_, _>>()?;
    let envp_c: Vec<CString> = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            c(&kv)
        })
        .collect::<Result<_, _>>()?;
    let null = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(SpawnError::DevNull)?;
    let pointers = |strings: &[CString]| {
        strings
            .iter()
            .map(|s| s.as_ptr())
            .chain([std::ptr::null()])
            .collect::<Vec<_>>()
    };
    let mut plan = ChildPlan {
        program: program_c,
        argv: pointers(&argv_c),
        envp: pointers(&envp_c),
        null: null.as_raw_fd(),
        log: log.as_raw_fd(),
        owner: owner.map_or(-1, AsRawFd::as_raw_fd),
        errno: 0,
    };
    let own_pid_namespace =
        crate::host::settings::has_capability(crate::host::settings::CAP_SYS_ADMIN);
    let mut flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    if own_pid_namespace {
        flags |= libc::CLONE_NEWPID;
    }
    let mut stack = vec![0u8; CHILD_STACK_BYTES];
    // The stack grows down from its end, 16-byte aligned as the ABI wants.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK_BYTES) & !15;
    // No signal handler of the starter may run in the child while it
    // shares the starter's memory: all blocked around the clone, the child
    // resets them before unblocking.
    let mut all: libc::sigset_t = empty_set();
    let mut before: libc::sigset_t = empty_set();
    // SAFETY: both sets are valid and owned by this frame.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
    }
    // SAFETY: `child` runs on `stack` (alive until clone returns: with
    // CLONE_VFORK the starter waits for the child's exec or exit) and reads
    // `plan`, which outlives the call; the child calls only async-signal-safe
    // functions.
    let pid = unsafe {
        libc::clone(
            child,
            top as *mut libc::c_void,
            flags,
            (&mut plan as *mut ChildPlan).cast(),
        )
    };
    let cloned = std::io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut()) };
    drop(stack);
    if pid < 0 {
        return Err(SpawnError::Clone(cloned));
    }
    if plan.errno != 0 {
        // The child exited without its exec: reap it.
        // SAFETY: waits for the child just made; no pointer but null.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        return Err(SpawnError::Exec {
            program: program.display().to_string(),
            source: std::io::Error::from_raw_os_error(plan.errno),
        });
    }
    Ok(Spawned {
        pid: pid as u32,
        own_pid_namespace,
    })
}

fn empty_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset then initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    set
}

/// The child until `execve`: default signal handlers, no blocked signal,
/// its descriptors, the program. Only async-signal-safe calls, no
/// allocation: it shares the starter's memory.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildPlan` the starter keeps alive until this
    // child has exec'd or exited (CLONE_VFORK).
    let plan = unsafe { &mut *arg.cast::<ChildPlan>() };
    // SAFETY: sigaction, sigprocmask, dup2, fcntl, execve and _exit are
    // async-signal-safe; every pointer is valid for the call.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..=libc::SIGRTMAX() {
            if libc::sigaction(signal, std::ptr::null(), &mut old) == 0
                && (old.sa_sigaction != libc::SIG_IGN || signal == libc::SIGPIPE)
            {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        let none = empty_set();
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        let moved = libc::dup2(plan.null, 0) >= 0
            && libc::dup2(plan.null, 1) >= 0
            && libc::dup2(plan.log, 2) >= 0
            && (plan.owner < 0
                || if plan.owner == OWNER_FD {
                    libc::fcntl(OWNER_FD, libc::F_SETFD, 0) >= 0
                } else {
                    libc::dup2(plan.owner, OWNER_FD) >= 0
                });
        if moved {
            libc::execve(
                plan.program.as_ptr(),
                plan.argv.as_ptr(),
                plan.envp.as_ptr(),
            );
        }
        plan.errno = *libc::__errno_location();
        if plan.errno == 0 {
            plan.errno = libc::EIO;
        }
        libc::_exit(127)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(pid: u32) -> i32 {
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid int.
        unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn a_program_runs_with_its_arguments_log_and_owner_descriptor() {
        let dir = std::env::temp_dir().join(format!("ma-spawn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log_path = dir.join("log");
        let log = File::create(&log_path).unwrap();
        let owner: OwnedFd = File::open("/dev/null").unwrap().into();
        let script = "echo \"$1\" >&2; [ -e /proc/self/fd/3 ] && echo owner >&2; \
                      [ -e /proc/self/fd/4 ] && echo leaked >&2; read x; echo \"read:$x\" >&2";
        let args: Vec<OsString> = ["-c", script, "sh", "hello"].map(Into::into).to_vec();
        let spawned = spawn(Path::new("/bin/sh"), &args, &log, Some(&owner)).unwrap();
        assert_eq!(wait(spawned.pid), 0);
        let text = std::fs::read_to_string(&log_path).unwrap();
        assert_eq!(text, "hello\nowner\nread:\n", "{text}");
        let none = spawn(Path::new("/bin/sh"), &args, &log, None).unwrap();
        assert_eq!(wait(none.pid), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_program_is_an_exec_error() {
        let log = File::create("/dev/null").unwrap();
        let err = spawn(Path::new("/nonexistent/program"), &[], &log, None).unwrap_err();
        assert!(
            matches!(&err, SpawnError::Exec { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{err:?}"
        );
    }

    #[test]
    fn with_cap_sys_admin_the_process_is_pid_1_of_its_namespace() {
        let log_path = std::env::temp_dir().join(format!("ma-spawn-ns-{}", std::process::id()));
        let log = File::create(&log_path).unwrap();
        let args: Vec<OsString> = ["-c", "echo $$ >&2"].map(Into::into).to_vec();
        let spawned = spawn(Path::new("/bin/sh"), &args, &log, None).unwrap();
        assert_eq!(wait(spawned.pid), 0);
        let inside = std::fs::read_to_string(&log_path).unwrap();
        let _ = std::fs::remove_file(&log_path);
        if spawned.own_pid_namespace {
            assert_eq!(inside.trim(), "1");
        } else {
            assert_eq!(inside.trim(), spawned.pid.to_string());
        }
    }
}
