//! The client against a hostile agent (a fake on a socket pair) that sends
//! more than was asked for: it stops with an error at the bound, having
//! kept no more than that.

use guest_agent::client::{ClientError, GuestAgentClient};
use guest_agent::frame::{self, FrameKind};
use guest_agent::protocol::{Response, MIN_PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers the first request with `hello`, a `file` header, then data
/// frames without end (until the client hangs up).
async fn endless_file(mut agent: tokio::net::UnixStream) {
    let mut request = [0u8; 4096];
    let _ = agent.read(&mut request).await;
    let hello = Response::Hello {
        version: MIN_PROTOCOL_VERSION,
        agent: "hostile".into(),
        capabilities: Vec::new(),
    };
    let mut bytes = frame::encode_json(&hello).unwrap();
    bytes.extend(
        frame::encode_json(&Response::File {
            size: 10,
            mode: 0o644,
        })
        .unwrap(),
    );
    if agent.write_all(&bytes).await.is_err() {
        return;
    }
    let chunk = frame::encode(FrameKind::Data, &[b'x'; 60_000]).unwrap();
    while agent.write_all(&chunk).await.is_ok() {}
}

#[tokio::test]
async fn a_read_stops_at_the_length_asked_for() {
    let (host, agent) = tokio::net::UnixStream::pair().unwrap();
    let fake = tokio::spawn(endless_file(agent));
    let mut out = Vec::new();
    let err = GuestAgentClient::new(host)
        .read_file_to("/f", None, Some(100_000), &mut out)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Oversized { limit: 100_000 }),
        "{err}"
    );
    assert!(out.len() <= 100_000, "kept {} bytes", out.len());
    fake.await.unwrap();
}

/// Answers `hello` to the first request, then nothing, keeping the
/// connection open until the client hangs up.
async fn stalled(mut agent: tokio::net::UnixStream, say_hello: bool) {
    let mut request = [0u8; 4096];
    let _ = agent.read(&mut request).await;
    if say_hello {
        let hello = Response::Hello {
            version: MIN_PROTOCOL_VERSION,
            agent: "stalled".into(),
            capabilities: Vec::new(),
        };
        let _ = agent.write_all(&frame::encode_json(&hello).unwrap()).await;
    }
    // Until the client closes its end.
    let _ = agent.read(&mut request).await;
}

#[tokio::test]
async fn a_call_to_an_agent_that_stops_answering_ends_at_its_deadline() {
    use std::time::{Duration, Instant};
    let idle = Duration::from_millis(300);
    for say_hello in [false, true] {
        let (host, agent) = tokio::net::UnixStream::pair().unwrap();
        let fake = tokio::spawn(stalled(agent, say_hello));
        let started = Instant::now();
        let err = GuestAgentClient::new(host)
            .idle_deadline(idle)
            .stat("/f")
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Stalled { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        fake.await.unwrap();

        let (host, agent) = tokio::net::UnixStream::pair().unwrap();
        let fake = tokio::spawn(stalled(agent, say_hello));
        let mut out = Vec::new();
        let err = GuestAgentClient::new(host)
            .idle_deadline(idle)
            .read_file_to("/f", None, None, &mut out)
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Stalled { .. }), "{err}");
        fake.await.unwrap();
    }
}

/// Answers a `process_output` with lengths far past what was asked for,
/// then streams stdout frames without end (until the client hangs up).
async fn endless_process_output(mut agent: tokio::net::UnixStream) {
    use guest_agent::protocol::{OutputAnswer, OutputChunk, ProcessEntry, ProcessRunState};
    let mut request = [0u8; 4096];
    let _ = agent.read(&mut request).await;
    let hello = Response::Hello {
        version: MIN_PROTOCOL_VERSION,
        agent: "hostile".into(),
        capabilities: Vec::new(),
    };
    let huge = OutputChunk {
        cursor: 0,
        len: u64::MAX,
        next_cursor: u64::MAX,
        dropped: 0,
    };
    let answer = Response::ProcessOutput(OutputAnswer {
        process: ProcessEntry {
            id: "p1".into(),
            pid: 7,
            command: "yes".into(),
            state: ProcessRunState::Running,
            started_unix_ms: 0,
            ended_unix_ms: None,
            exit_code: None,
            signal: None,
            timed_out: false,
            stdout_bytes: u64::MAX,
            stderr_bytes: 0,
            stdin_open: false,
            ring_bytes: 1 << 20,
        },
        stdout: huge,
        stderr: OutputChunk::default(),
        eof: false,
    });
    let mut bytes = frame::encode_json(&hello).unwrap();
    bytes.extend(frame::encode_json(&answer).unwrap());
    if agent.write_all(&bytes).await.is_err() {
        return;
    }
    let chunk = frame::encode(FrameKind::Stdout, &[b'y'; 60_000]).unwrap();
    while agent.write_all(&chunk).await.is_ok() {}
}

#[tokio::test]
async fn a_process_read_takes_no_more_than_was_asked_for() {
    use std::time::Duration;
    for (asked, cap) in [
        (Some(1000), 1000),
        (None, guest_agent::protocol::MAX_PROCESS_READ),
        (Some(u64::MAX), guest_agent::protocol::MAX_PROCESS_READ),
    ] {
        let (host, agent) = tokio::net::UnixStream::pair().unwrap();
        let fake = tokio::spawn(endless_process_output(agent));
        let err = GuestAgentClient::new(host)
            .process_output("p1", [0, 0], asked, Duration::ZERO)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Oversized { limit } if limit == cap),
            "{err}"
        );
        fake.await.unwrap();
    }
}

/// Serves one connection on `listener` as a hybrid vsock socket would, then
/// answers whatever comes one byte every 50 ms, without end (until the
/// client hangs up): each byte in well within any read timeout.
fn trickling(listener: std::os::unix::net::UnixListener, in_handshake: bool) {
    use std::io::{Read, Write};
    let Ok((mut agent, _)) = listener.accept() else {
        return;
    };
    let mut request = [0u8; 4096];
    let _ = agent.read(&mut request);
    let mut bytes = if in_handshake {
        b"OK 1".to_vec()
    } else {
        let _ = agent.write_all(b"OK 1\n");
        let _ = agent.read(&mut request);
        let hello = Response::Hello {
            version: MIN_PROTOCOL_VERSION,
            agent: "trickling".into(),
            capabilities: Vec::new(),
        };
        frame::encode_json(&hello).unwrap()
    };
    // A frame that never ends: a length far past what comes.
    bytes.extend(std::iter::repeat_n(b' ', 1 << 20));
    for b in bytes {
        if agent.write_all(&[b]).is_err() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_blocking_call_to_an_agent_that_trickles_ends_at_its_deadline() {
    use guest_agent::client::blocking::BlockingClient;
    use std::time::{Duration, Instant};
    let dir = std::env::temp_dir().join(format!("trickle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for in_handshake in [true, false] {
        let path = dir.join(format!("vsock-{in_handshake}"));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let fake = std::thread::spawn(move || trickling(listener, in_handshake));
        let started = Instant::now();
        let err = BlockingClient::connect_hybrid_vsock(&path, 1024, Duration::from_millis(500))
            .and_then(BlockingClient::ping)
            .unwrap_err();
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "{took:?}: {err}");
        fake.join().unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
