//! Named pause points for the kill -9 tests. With
//! `MICROAGENT_TEST_PAUSE_AT=<step>` in its environment a process that
//! reaches that step of an operation says so on stderr and waits to be
//! killed, so `crates/cli/tests/kill9_e2e.rs` can end the CLI, the MCP
//! server or a VMM at a chosen step and check what the next command
//! reports. Without the variable a point costs one environment lookup.

use std::time::Duration;

/// The environment variable naming the step to pause at.
pub const PAUSE_VAR: &str = "MICROAGENT_TEST_PAUSE_AT";

/// What a paused process writes to stderr, before the step's name.
pub const PAUSED_PREFIX: &str = "microagent: paused at ";

/// Pauses for good when `step` is the one the environment names.
pub fn pause_point(step: &str) {
    let Some(wanted) = std::env::var_os(PAUSE_VAR) else {
        return;
    };
    if wanted != step {
        return;
    }
    eprintln!("{PAUSED_PREFIX}{step} (pid {})", std::process::id());
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
