//! SIGKILL of the CLI, of the MCP server and of a VMM at named steps of
//! create, start, snapshot, stop and delete (`MICROAGENT_TEST_PAUSE_AT`
//! stops the process there; `workspace::pause_point`), each followed by
//! the next command, which must report a consistent state; at the end
//! nothing of the state directory is left (no process, file or cgroup).
//! Real guests: each workspace is fresh, so it resumes the image's warm
//! snapshot in seconds.
//!
//! The pause points exist only in builds with the `test-hooks` feature
//! (`cargo xtask test` enables it); without it the suite is skipped.

#[cfg(feature = "test-hooks")]
mod suite;

#[cfg(not(feature = "test-hooks"))]
#[test]
fn killed_at_each_step_the_next_command_finds_a_consistent_state() {
    testkit::skip(
        "killed_at_each_step_the_next_command_finds_a_consistent_state",
        "the binaries were built without the test-hooks feature (cargo xtask test enables it: --features microagent/test-hooks,microagent-vmm/test-hooks)",
    );
}
