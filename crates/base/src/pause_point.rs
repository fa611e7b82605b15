//! Named pause points for the kill -9 tests. With
//! `MICROAGENT_TEST_PAUSE_AT=<step>` in its environment a process that
//! reaches that step of an operation says so on stderr and waits to be
//! killed, so `crates/cli/tests/kill9_e2e/` can end the CLI, the MCP
//! server or a VMM at a chosen step and check what the next command
//! reports. Without the variable a point costs one environment lookup.
//!
//! The hooks exist only with the `test-hooks` feature, which `cargo xtask
//! test` enables and shipped builds never do (`cargo xtask dist` checks
//! that its binaries hold neither variable's name); without it a pause
//! point is nothing.

#[cfg(not(feature = "test-hooks"))]
/// Nothing: this build has no test hooks.
#[inline(always)]
pub fn pause_point(_step: &str) {}

#[cfg(feature = "test-hooks")]
pub use hooks::*;

#[cfg(feature = "test-hooks")]
mod hooks {
    use std::time::Duration;

    /// The environment variable naming the step to pause at.
    pub const PAUSE_VAR: &str = "MICROAGENT_TEST_PAUSE_AT";

    /// What a paused process writes to stderr, before the step's name.
    pub const PAUSED_PREFIX: &str = "microagent: paused at ";

    /// The environment variable naming the step at which a process makes a
    /// system call its seccomp filter refuses (a netlink socket), as a bug
    /// would, so the tests see how a filter's kill is recorded.
    pub const REFUSED_SYSCALL_VAR: &str = "MICROAGENT_TEST_REFUSED_SYSCALL_AT";

    /// Pauses for good when `step` is the one the environment names (or makes
    /// the refused call, when that variable names it).
    pub fn pause_point(step: &str) {
        if std::env::var_os(REFUSED_SYSCALL_VAR).is_some_and(|s| s == step) {
            // SAFETY: socket(2) takes no pointers; under the VMM's filters it
            // does not return.
            unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) };
        }
        let Some(wanted) = std::env::var_os(PAUSE_VAR) else {
            return;
        };
        if wanted != step {
            return;
        }
        eprintln!(
            "{PAUSED_PREFIX}{step} (pid {})",
            crate::host::settings::own_pid()
        );
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}
