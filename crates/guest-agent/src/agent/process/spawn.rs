//! Starting a process: a `vfork`-style `clone` whose child makes only the
//! system calls this process needs, then `execve`.
//!
//! Why not `std::process::Command`: in this static binary std spawns by
//! glibc's `posix_spawn`, whose child sets the disposition of every one of
//! the 64 signals (about 130 `rt_sigaction` calls), and in a guest whose
//! kernel mode is emulated each system call costs most of a millisecond:
//! about 90 ms of every exec. `execve` resets handled signals to their
//! defaults by itself; the child here only resets, before it unblocks
//! signals, the few that are not at their default in the agent: those with
//! handlers (so none can run in the child, which shares the agent's memory
//! until `execve`) and those ignored, which `execve` would pass on
//! (SIGPIPE, ignored by Rust's runtime; SIGINT and SIGQUIT when whoever
//! started the agent ran it in the background, SIGHUP under `nohup`): a
//! command starts with every signal at its default, as in a fresh shell.
//!
//! The child runs on its own small stack in the agent's address space
//! while the calling thread is suspended (`CLONE_VM | CLONE_VFORK`): it
//! reads a plan prepared beforehand and allocates nothing. If a step
//! fails it stores the error number in the plan and exits with 127; the
//! parent then reaps it and returns that error.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

use super::root::MOUNTED_INSIDE;

/// The child's stack: it calls a few libc wrappers and `execve`.
const CHILD_STACK: usize = 64 << 10;
/// Signal numbers are 1 to 64 on Linux.
const SIGNALS: libc::c_int = 64;

/// Where the child's stdin comes from.
#[derive(Debug, Default)]
pub enum Input {
    /// `/dev/null`.
    #[default]
    Null,
    /// A new pipe; the parent gets its write end.
    Piped,
    /// This descriptor (a pty's slave side).
    Fd(OwnedFd),
}

/// Where the child's stdout or stderr goes.
#[derive(Debug, Default)]
pub enum Output {
    /// A new pipe; the parent gets its read end.
    #[default]
    Piped,
    /// This descriptor (a pty's slave side).
    Fd(OwnedFd),
}

/// The process group or session the child starts in.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Session {
    /// A new process group led by the child (signals reach its whole tree).
    #[default]
    NewGroup,
    /// A new session whose controlling terminal is the child's stdin.
    Terminal,
}

/// What to start: a program, its arguments and environment, its
/// directory, user, descriptors and session.
#[derive(Debug)]
pub struct Spawn {
    program: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: Option<CString>,
    /// Its own root directory and the mount points in it (root.rs).
    root: Option<[CString; 4]>,
    uid: Option<u32>,
    gid: Option<u32>,
    stdin: Input,
    stdout: Output,
    stderr: Output,
    session: Session,
    /// A string held a NUL byte: spawning fails with InvalidInput.
    saw_nul: bool,
}

/// A started process: its pid and the parent's ends of its pipes.
#[derive(Debug)]
pub struct Child {
    pub pid: u32,
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
}

impl Spawn {
    /// Runs `program` (a path, not looked up) with `arg0` as its name.
    pub fn new(program: &Path, arg0: &str) -> Self {
        let mut spawn = Self {
            program: CString::default(),
            argv: Vec::new(),
            env: Vec::new(),
            cwd: None,
            root: None,
            uid: None,
            gid: None,
            stdin: Input::Null,
            stdout: Output::Piped,
            stderr: Output::Piped,
            session: Session::NewGroup,
            saw_nul: false,
        };
        spawn.program = spawn.c_string(program.as_os_str().as_bytes());
        spawn.arg(arg0);
        spawn
    }

    fn c_string(&mut self, bytes: &[u8]) -> CString {
        CString::new(bytes).unwrap_or_else(|_| {
            self.saw_nul = true;
            CString::default()
        })
    }

    /// Appends an argument.
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        let arg = self.c_string(arg.as_ref().as_bytes());
        self.argv.push(arg);
        self
    }

    /// Sets `key` (replacing an earlier value) in the child's environment,
    /// which starts empty.
    pub fn env(&mut self, key: &str, value: &str) -> &mut Self {
        let prefix = format!("{key}=");
        self.env
            .retain(|kv| !kv.as_bytes().starts_with(prefix.as_bytes()));
        let kv = self.c_string(format!("{key}={value}").as_bytes());
        self.env.push(kv);
        self
    }

    /// The child's working directory (else the agent's, `/`).
    pub fn cwd(&mut self, dir: &str) -> &mut Self {
        self.cwd = Some(self.c_string(dir.as_bytes()));
        self
    }

    /// Runs the child in a mount namespace of its own with `dir` as its
    /// root, the guest's /proc, /dev and /sys mounted inside; the working
    /// directory is then inside it. The mount points must exist.
    pub fn root(&mut self, dir: &Path) -> &mut Self {
        let dirs = [
            self.c_string(dir.as_os_str().as_bytes()),
            self.c_string(dir.join(MOUNTED_INSIDE[0]).as_os_str().as_bytes()),
            self.c_string(dir.join(MOUNTED_INSIDE[1]).as_os_str().as_bytes()),
            self.c_string(dir.join(MOUNTED_INSIDE[2]).as_os_str().as_bytes()),
        ];
        self.root = Some(dirs);
        self
    }

    /// Runs the child as this user (supplementary groups dropped).
    pub fn uid(&mut self, uid: u32) -> &mut Self {
        self.uid = Some(uid);
        self
    }

    /// Runs the child with this group.
    pub fn gid(&mut self, gid: u32) -> &mut Self {
        self.gid = Some(gid);
        self
    }

    pub fn stdin(&mut self, input: Input) -> &mut Self {
        self.stdin = input;
        self
    }

    pub fn stdout(&mut self, output: Output) -> &mut Self {
        self.stdout = output;
        self
    }

    pub fn stderr(&mut self, output: Output) -> &mut Self {
        self.stderr = output;
        self
    }

    pub fn session(&mut self, session: Session) -> &mut Self {
        self.session = session;
        self
    }

    /// Starts the process. The descriptors given as `Fd` are consumed (the
    /// parent's copies closed), so a pty's master sees the end once the
    /// child and its descendants have closed the slave.
    pub fn spawn(&mut self) -> io::Result<Child> {
        if self.saw_nul {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an argument, environment entry or directory contains a NUL byte",
            ));
        }
        let (stdin, parent_stdin) = match std::mem::take(&mut self.stdin) {
            Input::Null => (open_null()?, None),
            Input::Piped => {
                let (read, write) = pipe()?;
                (read, Some(write))
            }
            Input::Fd(fd) => (fd, None),
        };
        let (stdout, parent_stdout) = output_ends(std::mem::take(&mut self.stdout))?;
        let (stderr, parent_stderr) = output_ends(std::mem::take(&mut self.stderr))?;
        // The child's dup2 onto 0, 1 and 2 must not overwrite a source.
        let fds = [
            above_stdio(stdin)?,
            above_stdio(stdout)?,
            above_stdio(stderr)?,
        ];

        let argv = pointers(&self.argv);
        let envp = pointers(&self.env);
        let plan = Plan {
            program: self.program.as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            cwd: self.cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            root: self
                .root
                .as_ref()
                .map(|dirs| dirs.each_ref().map(|c| c.as_ptr())),
            uid: self.uid,
            gid: self.gid,
            fds: [fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd()],
            terminal: self.session == Session::Terminal,
            reset: changed_signals(),
            error: AtomicI32::new(0),
        };
        let pid = clone_child(&plan)?;
        drop(fds);
        let error = plan.error.load(Ordering::SeqCst);
        if error != 0 {
            reap(pid);
            return Err(io::Error::from_raw_os_error(error));
        }
        Ok(Child {
            // A pid from clone is positive.
            pid: pid.unsigned_abs(),
            stdin: parent_stdin.map(File::from),
            stdout: parent_stdout.map(File::from),
            stderr: parent_stderr.map(File::from),
        })
    }
}

/// Everything the child needs, prepared by the parent; the child only
/// reads it (and writes `error`).
struct Plan {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    /// Root, then its proc, dev and sys mount points.
    root: Option<[*const libc::c_char; 4]>,
    uid: Option<u32>,
    gid: Option<u32>,
    fds: [libc::c_int; 3],
    terminal: bool,
    /// Signals (bit n-1 for signal n) the child sets to SIG_DFL.
    reset: u64,
    error: AtomicI32,
}

fn bit(signal: libc::c_int) -> u64 {
    1u64 << (signal - 1)
}

/// NUL-terminated pointer array over `strings`, which must outlive it.
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

fn output_ends(output: Output) -> io::Result<(OwnedFd, Option<OwnedFd>)> {
    Ok(match output {
        Output::Piped => {
            let (read, write) = pipe()?;
            (write, Some(read))
        }
        Output::Fd(fd) => (fd, None),
    })
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both are new descriptors owned by no one.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn open_null() -> io::Result<OwnedFd> {
    Ok(OwnedFd::from(
        std::fs::OpenOptions::new().read(true).open("/dev/null")?,
    ))
}

/// `fd`, or a close-on-exec copy of it numbered 3 or more.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC duplicates a descriptor we own; no pointers.
    let copy = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: fcntl succeeded, so `copy` is a new descriptor owned by no one.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// Signals that have a handler in this process or are ignored, read once:
/// the agent changes none after it starts (Rust's runtime installs SIGSEGV
/// and SIGBUS handlers and ignores SIGPIPE before `main`).
fn changed_signals() -> u64 {
    static CHANGED: OnceLock<u64> = OnceLock::new();
    *CHANGED.get_or_init(|| {
        let mut changed = 0;
        for signal in 1..=SIGNALS {
            // SAFETY: sigaction is plain data; all zeroes is a valid value.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: a null new action only reads the current one into
            // `old`; an invalid signal number is an error return.
            let rc = unsafe { libc::sigaction(signal, std::ptr::null(), &mut old) };
            if rc == 0 && old.sa_sigaction != libc::SIG_DFL {
                changed |= bit(signal);
            }
        }
        changed
    })
}

/// Clones the child with every signal blocked (so none runs in it before
/// it has reset the handlers) and waits, as vfork does, until it has
/// called execve or exited.
fn clone_child(plan: &Plan) -> io::Result<libc::pid_t> {
    let mut stack = vec![0u8; CHILD_STACK];
    // The stack grows down from its 16-byte aligned top.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK) & !15;
    // SAFETY: sigset_t is plain data; sigfillset/pthread_sigmask write
    // only to the sets they are given.
    let (mut all, mut old): (libc::sigset_t, libc::sigset_t) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: as above.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // SAFETY: the child runs `child_main` on `stack` (alive until this
    // returns, which CLONE_VFORK makes after the child's execve or exit)
    // with a pointer to `plan`, which it only reads and whose atomic it
    // writes; it shares our memory but allocates nothing and takes no lock.
    let pid = unsafe {
        libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            plan as *const Plan as *mut libc::c_void,
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(stack);
    if pid == -1 {
        return Err(clone_error);
    }
    Ok(pid)
}

/// Reaps a child that failed before its execve. The caller holds the
/// reaper's lock, so the reaper thread, which only peeks before taking
/// it, cannot have taken this status.
fn reap(pid: libc::pid_t) {
    let mut status = 0;
    loop {
        // SAFETY: waitpid stores into `status`, which outlives the call.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc != -1 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// The child: runs in the parent's memory on its own stack with every
/// signal blocked, and never returns to Rust code that could allocate,
/// lock or panic.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Plan` clone_child passed, alive while the
    // parent is suspended.
    let plan = unsafe { &*(arg as *const Plan) };
    // SAFETY: each call below is a system call wrapper that takes no lock
    // and allocates nothing; the pointers come from the plan, whose
    // strings and arrays the parent keeps alive. uid/gid changes use raw
    // system calls: glibc's wrappers would signal the parent's threads.
    unsafe {
        let fail = |plan: &Plan| -> ! {
            let errno = *libc::__errno_location();
            plan.error.store(errno.max(1), Ordering::SeqCst);
            libc::_exit(127)
        };
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..=SIGNALS {
            if plan.reset & bit(signal) != 0 {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        for (target, &fd) in (0..).zip(plan.fds.iter()) {
            if libc::dup2(fd, target) == -1 {
                fail(plan);
            }
        }
        if plan.terminal {
            if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                fail(plan);
            }
        } else if libc::setpgid(0, 0) == -1 {
            fail(plan);
        }
        if let Some([root, proc, dev, sys]) = plan.root {
            // Private first, so nothing mounted here shows in the agent's
            // namespace; the mounts end with the last process using them.
            let none = std::ptr::null::<libc::c_char>();
            let recursive_bind = libc::MS_BIND | libc::MS_REC;
            if libc::unshare(libc::CLONE_NEWNS) == -1
                || libc::mount(
                    none,
                    c"/".as_ptr(),
                    none,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) == -1
                || libc::mount(
                    c"proc".as_ptr(),
                    proc,
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                ) == -1
                || libc::mount(
                    c"/dev".as_ptr(),
                    dev,
                    none,
                    recursive_bind,
                    std::ptr::null(),
                ) == -1
                || libc::mount(
                    c"/sys".as_ptr(),
                    sys,
                    none,
                    recursive_bind,
                    std::ptr::null(),
                ) == -1
                || libc::chroot(root) == -1
                || libc::chdir(c"/".as_ptr()) == -1
            {
                fail(plan);
            }
        }
        if !plan.cwd.is_null() && libc::chdir(plan.cwd) == -1 {
            fail(plan);
        }
        if let Some(gid) = plan.gid {
            if libc::syscall(libc::SYS_setgid, gid) == -1 {
                fail(plan);
            }
        }
        if let Some(uid) = plan.uid {
            if libc::geteuid() == 0
                && libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) == -1
            {
                fail(plan);
            }
            if libc::syscall(libc::SYS_setuid, uid) == -1 {
                fail(plan);
            }
        }
        let empty: u64 = 0;
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            std::ptr::null_mut::<u64>(),
            std::mem::size_of::<u64>(),
        );
        libc::execve(plan.program, plan.argv, plan.envp);
        fail(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn wait(pid: u32) -> i32 {
        let mut status = 0;
        // SAFETY: waitpid stores into `status`.
        let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        assert_eq!(rc, pid as libc::pid_t);
        status
    }

    fn read_all(file: Option<File>) -> String {
        let mut text = String::new();
        file.unwrap().read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn a_child_gets_its_arguments_environment_directory_and_group() {
        let mut spawn = Spawn::new(Path::new("/bin/sh"), "sh");
        spawn
            .arg("-c")
            .arg("echo \"$0 $A $B\"; pwd; cat; echo err >&2; test $(ps -o pgid= $$ 2>/dev/null || cat /proc/$$/stat | cut -d' ' -f5) -eq $$ && echo leader")
            .env("A", "one")
            .env("B", "x")
            .env("B", "two")
            .cwd("/tmp")
            .stdin(Input::Piped);
        let mut child = spawn.spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"from stdin\n").unwrap();
        drop(stdin);
        let out = read_all(child.stdout.take());
        let err = read_all(child.stderr.take());
        assert_eq!(wait(child.pid), 0);
        assert_eq!(out, "sh one two\n/tmp\nfrom stdin\nleader\n");
        assert_eq!(err, "err\n");
    }

    #[test]
    fn a_child_with_a_root_sees_it_as_slash_with_proc_and_dev_inside() {
        const TEST: &str = "a_child_with_a_root_sees_it_as_slash_with_proc_and_dev_inside";
        let busybox = Path::new("/usr/bin/busybox");
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 || !busybox.exists() {
            testkit::skip(TEST, "needs root (a mount namespace) and busybox-static");
            return;
        }
        let dir = std::env::temp_dir().join(format!("agent-spawn-root-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::copy(busybox, dir.join("bin/busybox")).unwrap();
        std::fs::write(dir.join("marker"), "inside\n").unwrap();
        for name in MOUNTED_INSIDE {
            std::fs::create_dir_all(dir.join(name)).unwrap();
        }
        let mut spawn = Spawn::new(Path::new("/bin/busybox"), "sh");
        spawn
            .arg("-c")
            .arg("cat /marker; pwd; test -r /proc/self/status && echo proc; test -c /dev/null && echo dev")
            .cwd("/bin")
            .root(&dir);
        let mut child = spawn.spawn().unwrap();
        let out = read_all(child.stdout.take());
        let err = read_all(child.stderr.take());
        assert_eq!(wait(child.pid), 0, "{err}");
        assert_eq!(out, "inside\n/bin\nproc\ndev\n");
        // The mounts were the child's alone: nothing is left mounted here.
        assert!(!dir.join("proc/self").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_child_starts_with_no_signal_blocked_and_sigpipe_default() {
        let mut spawn = Spawn::new(Path::new("/bin/sh"), "sh");
        spawn
            .arg("-c")
            .arg("grep -E '^Sig(Blk|Ign)' /proc/self/status");
        let mut child = spawn.spawn().unwrap();
        let out = read_all(child.stdout.take());
        assert_eq!(wait(child.pid), 0);
        assert!(out.contains("SigBlk:\t0000000000000000"), "{out}");
        let ignored = out
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:\t"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .unwrap();
        assert_eq!(ignored & bit(libc::SIGPIPE), 0, "{out}");
    }

    #[test]
    fn a_program_that_cannot_run_is_an_error_and_leaves_no_child() {
        let mut spawn = Spawn::new(Path::new("/nonexistent/program"), "program");
        let e = spawn.spawn().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let mut bad_dir = Spawn::new(Path::new("/bin/true"), "true");
        bad_dir.cwd("/nonexistent-dir");
        assert_eq!(
            bad_dir.spawn().unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        let mut nul = Spawn::new(Path::new("/bin/true"), "true");
        nul.env("A", "b\0c");
        assert_eq!(nul.spawn().unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn an_exit_status_and_a_signal_reach_the_parent() {
        let mut spawn = Spawn::new(Path::new("/bin/sh"), "sh");
        spawn.arg("-c").arg("exit 7");
        let child = spawn.spawn().unwrap();
        let status = wait(child.pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7);
        let mut spawn = Spawn::new(Path::new("/bin/sh"), "sh");
        spawn.arg("-c").arg("kill -TERM $$");
        let child = spawn.spawn().unwrap();
        let status = wait(child.pid);
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGTERM);
    }
}
