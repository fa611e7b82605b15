//! One command through the exec request path before the first connection
//! is served. A snapshot kept right after the agent first answers (an
//! image's warm snapshot) then holds a guest whose exec path is warm: the
//! page cache of what a command reads, the dentries of its lookups, a
//! connection thread waiting. Measured on a host that emulates guest
//! kernel mode: the first `exec true` on a workspace resumed from a warm
//! snapshot taken before any command cost 3.1 M emulated guest kernel
//! instructions (2.9 s), against 1.3 M when one command had run before
//! the snapshot; every fresh workspace paid that once. A cold boot pays
//! it now, once, before its agent answers.

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use guest_agent::frame::{self, FrameKind};
use guest_agent::protocol::{ExecCall, ExecExit, Request, Response, PROTOCOL_VERSION};

use super::{AgentState, Workers};

/// The most the warm-up may hold back serving (a command that hangs in a
/// broken image must not keep the guest from answering).
const WARM_UP_BOUND: Duration = Duration::from_secs(60);

/// Runs `true` as a caller's first command would run (a connection of its
/// own, a hello, an exec), and waits for it to end. Failures are logged:
/// an image without `true` is served as before, only not warmed.
pub(super) fn run(workers: &Workers, state: &Arc<AgentState>) {
    if let Err(e) = exec_true(workers, state) {
        log!("warming the exec path: {e}");
    }
}

/// How the command ended.
fn exec_true(workers: &Workers, state: &Arc<AgentState>) -> io::Result<ExecExit> {
    let (mut ours, theirs) = UnixStream::pair()?;
    ours.set_read_timeout(Some(WARM_UP_BOUND))?;
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
    frame::write_json(&mut ours, &Request::Exec(ExecCall::argv(["true"])))
        .map_err(io::Error::other)?;
    // The agent closes the connection once the command has ended.
    let mut exited = None;
    while let Some(frame) = frame::read_frame(&mut ours).map_err(io::Error::other)? {
        if frame.kind != FrameKind::Json {
            continue;
        }
        match frame::decode_json(&frame) {
            Ok(Response::Exited(exit)) => exited = Some(exit),
            Ok(Response::Error { code, message }) => {
                return Err(io::Error::other(format!("{code:?}: {message}")))
            }
            _ => {}
        }
    }
    exited.ok_or_else(|| io::Error::other("the command's end was not seen"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_up_runs_a_command_through_a_connection_and_waits_for_its_end() {
        let config = super::super::Config {
            idle_timeout: Duration::from_secs(5),
            max_connections: 8,
            verbose: false,
            dial: super::super::forward::Dial::Vsock,
        };
        let state = AgentState::start(config).unwrap();
        let workers = Workers::default();
        let exit = exec_true(&workers, &state).unwrap();
        assert_eq!((exit.code, exit.signal), (Some(0), None), "{exit:?}");
        // The command ran to its end and was counted as use.
        assert!(state.last_request_ms.load(Ordering::SeqCst) > 0);
        // Its connection's thread waits for the next connection.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while workers.shared.idle.load(Ordering::SeqCst) == 0 {
            assert!(std::time::Instant::now() < deadline, "no idle worker");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(state.connections.load(Ordering::SeqCst), 0);
    }
}
