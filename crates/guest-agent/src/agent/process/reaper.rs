//! The one reaper: a thread that waits for any child (`waitid(P_ALL)`) and
//! hands each exit status to whoever spawned that pid, so an exec's status
//! is never taken by anyone else, and orphans re-parented to the agent (as
//! PID 1 or as a child subreaper) are reaped too.
//!
//! Race-free registration: [`Reaper::spawn`] holds the reaper's lock from
//! before the spawn until the pid is registered, and the thread first only
//! peeks at an exited child (`WNOWAIT`), then takes the lock, then reaps it.
//! So a child that dies at once is still routed to its exec, and the
//! reap after a failed exec (agent/spawn.rs) finds its zombie still there.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::spawn::{Child, Spawn};

/// How often a reaper with no children looks for adopted ones: an idle
/// guest's agent should not wake its (emulated) kernel every second.
const ADOPTION_CHECK: Duration = Duration::from_secs(60);

/// Called with the raw wait status of the child it was registered for.
pub type ExitCallback = Box<dyn FnOnce(i32) + Send>;

#[derive(Default)]
struct Registered {
    callbacks: HashMap<libc::pid_t, ExitCallback>,
    /// Spawns so far: lets the thread sleep without missing a new child.
    spawns: u64,
}

#[derive(Default)]
struct Shared {
    registered: Mutex<Registered>,
    spawned: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Registered> {
        // A panicking callback cannot leave the map half-updated.
        self.registered.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Handle on the reaper thread.
#[derive(Clone)]
pub struct Reaper {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reaper")
    }
}

impl Reaper {
    /// Starts the reaper thread; `verbose` logs each orphan reaped.
    pub fn start(verbose: bool) -> io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("reaper".into())
            .stack_size(64 << 10)
            .spawn(move || reap_forever(&thread_shared, verbose))?;
        Ok(Self { shared })
    }

    /// Spawns `spawn`; `on_exit` gets its wait status once it exits.
    pub fn spawn(&self, spawn: &mut Spawn, on_exit: ExitCallback) -> io::Result<Child> {
        let mut registered = self.shared.lock();
        let child = spawn.spawn()?;
        // Linux pids fit in pid_t.
        registered
            .callbacks
            .insert(child.pid as libc::pid_t, on_exit);
        registered.spawns += 1;
        self.shared.spawned.notify_all();
        Ok(child)
    }
}

fn reap_forever(shared: &Shared, verbose: bool) {
    loop {
        let spawns_before = shared.lock().spawns;
        let pid = match wait_any_exited() {
            Ok(pid) => pid,
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                // No children: sleep until one is spawned. An orphan is
                // adopted only from a descendant, which is a child until
                // then, so this only guards against the kernel's own
                // helpers: rarely enough not to wake an idle guest.
                let registered = shared.lock();
                let _ = shared
                    .spawned
                    .wait_timeout_while(registered, ADOPTION_CHECK, |r| r.spawns == spawns_before);
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log!("reaper: waitid failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let mut registered = shared.lock();
        let mut status = 0;
        // SAFETY: `status` is a valid place for waitpid to store the status;
        // WNOHANG makes this return at once.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if reaped != pid {
            // Already reaped by whoever spawned it (std after a failed exec).
            continue;
        }
        let callback = registered.callbacks.remove(&pid);
        drop(registered);
        match callback {
            Some(callback) => callback(status),
            None if verbose => log!("reaped orphan pid {pid}"),
            None => {}
        }
    }
}

/// Blocks until some child has exited and returns its pid, leaving it a
/// zombie (WNOWAIT).
fn wait_any_exited() -> io::Result<libc::pid_t> {
    // SAFETY: siginfo_t is plain data; all zeroes is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid siginfo_t for waitid to fill.
    let r = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: waitid succeeded for an exited child (WEXITED), so the
    // kernel filled in the SIGCHLD fields, si_pid included.
    Ok(unsafe { info.si_pid() })
}

/// Exit code and signal number from a raw wait status.
pub fn decode_status(status: i32) -> (Option<i32>, Option<i32>) {
    if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    }
}
