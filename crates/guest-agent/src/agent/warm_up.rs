//! One command through the exec request path before the first connection
//! is served. A snapshot kept right after the agent first answers (an
//! image's warm snapshot) then holds a guest whose exec path is warm: the
//! page cache of what a command reads, the dentries of its lookups, a
//! connection thread waiting. Measured on a host that emulates guest
//! kernel mode: the first `exec true` on a workspace resumed from a warm
//! snapshot taken before any command cost 3.1 M emulated guest kernel
//! instructions (2.9 s), against 1.3 M when one command had run before
//! the snapshot; every fresh workspace paid that once. A cold boot pays
//! it now, once, before its agent answers. Tested through the binary
//! (`tests/exec.rs`): a reaper in a unit test's process would take the
//! children of other tests.

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use guest_agent::frame::{self, FrameKind};
use guest_agent::protocol::{ExecCall, ExecExit, Request, Response, PROTOCOL_VERSION};

use super::{AgentState, Workers};

/// The most the warm-up may hold back serving (a command that hangs in a
/// broken image must not keep the guest from answering).
const WARM_UP_BOUND: Duration = Duration::from_secs(60);
/// How long after the bound the warm-up still waits for the command's end.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// Runs `true` as a caller's first command would run (a connection of its
/// own, a hello, an exec), and waits for it to end. Failures are logged:
/// an image without `true` is served as before, only not warmed.
pub(super) fn run(workers: &Workers, state: &Arc<AgentState>) {
    if let Err(e) = exec_true(workers, state) {
        log!("warming the exec path: {e}");
    }
}

/// How `true` ended.
fn exec_true(workers: &Workers, state: &Arc<AgentState>) -> io::Result<ExecExit> {
    // The agent kills it at the bound; the wait gives that a moment more.
    let deadline = Instant::now() + WARM_UP_BOUND + KILL_GRACE;
    let (mut ours, theirs) = UnixStream::pair()?;
    let active = state.connections.fetch_add(1, Ordering::SeqCst);
    if let Err(e) = workers.hand_over(theirs, active, state) {
        state.connections.fetch_sub(1, Ordering::SeqCst);
        return Err(e);
    }
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        identity: None,
        host_time_ns: None,
    };
    frame::write_json(&mut ours, &hello).map_err(io::Error::other)?;
    // Killed (its process group) at the bound; what it prints is capped
    // by the exec path as any command's is.
    let call = ExecCall {
        timeout_ms: Some(WARM_UP_BOUND.as_millis() as u64),
        ..ExecCall::argv(["true"])
    };
    frame::write_json(&mut ours, &Request::Exec(call)).map_err(io::Error::other)?;
    // A command whose output outlives it (a daemon of its own session
    // holding its stdout) is left at the bound.
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::other("the command did not end in time"));
        }
        ours.set_read_timeout(Some(left))?;
        let Some(frame) = frame::read_frame(&mut ours).map_err(io::Error::other)? else {
            return Err(io::Error::other("the command's end was not seen"));
        };
        if frame.kind != FrameKind::Json {
            continue;
        }
        match frame::decode_json(&frame) {
            Ok(Response::Exited(exit)) => return Ok(exit),
            Ok(Response::Error { code, message }) => {
                return Err(io::Error::other(format!("{code:?}: {message}")))
            }
            _ => {}
        }
    }
}
