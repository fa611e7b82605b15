//! The agent over raw frames (no client): the handshake, malformed and
//! oversized input, version mismatch, the idle timeout.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{exchange, hello_bytes, ping, read_all, responses, Agent};
use guest_agent::frame::{self, FrameKind, MAX_JSON};
use guest_agent::protocol::{
    AgentErrorCode, Request, Response, WriteMode, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

fn error_code(frames: &[guest_agent::Frame]) -> Option<AgentErrorCode> {
    responses(frames).into_iter().find_map(|r| match r {
        Response::Error { code, .. } => Some(code),
        _ => None,
    })
}

fn with_hello(rest: &[u8]) -> Vec<u8> {
    let mut bytes = hello_bytes(PROTOCOL_VERSION);
    bytes.extend_from_slice(rest);
    bytes
}

#[test]
fn hello_and_a_pipelined_request_are_answered_in_order() {
    let agent = Agent::start();
    let got = responses(&exchange(
        &agent,
        &with_hello(&frame::encode_json(&Request::Ping).unwrap()),
    ));
    match got.as_slice() {
        [Response::Hello {
            version,
            agent,
            capabilities,
        }, Response::Pong { .. }] => {
            assert_eq!(*version, PROTOCOL_VERSION);
            assert!(agent.starts_with("microagent-agent "));
            assert!(capabilities.iter().any(|c| c == "exec"));
        }
        other => panic!("{other:?}"),
    }
    // Hello alone, then the client leaves: no error.
    let got = responses(&exchange(&agent, &hello_bytes(PROTOCOL_VERSION)));
    assert!(
        matches!(got.as_slice(), [Response::Hello { .. }]),
        "{got:?}"
    );
}

#[test]
fn an_identity_with_the_hello_is_taken_by_pid_1_only() {
    let agent = Agent::start();
    let hello = frame::encode_json(&Request::Hello {
        version: PROTOCOL_VERSION,
        identity: Some(guest_agent::protocol::NewIdentity {
            hostname: "claimed".into(),
            entropy: "00".repeat(32),
            unix_time_ns: 0,
        }),
        host_time_ns: Some(0),
    })
    .unwrap();
    let mut bytes = hello;
    bytes.extend(frame::encode_json(&Request::Ping).unwrap());
    let frames = exchange(&agent, &bytes);
    // A host process never changes the host's name, randomness or clock:
    // the request is refused before it is served.
    assert_eq!(error_code(&frames), Some(AgentErrorCode::PermissionDenied));
    assert!(
        !responses(&frames)
            .iter()
            .any(|r| matches!(r, Response::Pong { .. })),
        "the request ran without its identity"
    );
    // Without one, the same agent serves as before; the host's clock in a
    // hello is only for the guest's init, not an error elsewhere.
    ping(&agent);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut bytes = frame::encode_json(&Request::Hello {
        version: PROTOCOL_VERSION,
        identity: None,
        host_time_ns: Some(now),
    })
    .unwrap();
    bytes.extend(frame::encode_json(&Request::Ping).unwrap());
    let frames = exchange(&agent, &bytes);
    assert!(
        responses(&frames)
            .iter()
            .any(|r| matches!(r, Response::Pong { .. })),
        "{frames:?}"
    );
}

#[test]
fn version_mismatch_is_refused() {
    let agent = Agent::start();
    // Every version from the oldest up is answered in its own number.
    for version in MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION {
        let got = responses(&exchange(&agent, &hello_bytes(version)));
        assert!(
            matches!(got.as_slice(), [Response::Hello { version: v, .. }] if *v == version),
            "{got:?}"
        );
    }
    let frames = exchange(&agent, &hello_bytes(0));
    assert_eq!(
        error_code(&frames),
        Some(AgentErrorCode::UnsupportedVersion)
    );
    let frames = exchange(&agent, &hello_bytes(PROTOCOL_VERSION + 1));
    assert_eq!(
        error_code(&frames),
        Some(AgentErrorCode::UnsupportedVersion)
    );
    assert!(!responses(&frames)
        .iter()
        .any(|r| matches!(r, Response::Hello { .. })));
    ping(&agent);
}

#[test]
fn malformed_frames_get_an_error_and_the_agent_keeps_serving() {
    let agent = Agent::start();
    let json = |v: &str| frame::encode(FrameKind::Json, v.as_bytes()).unwrap();
    let oversized_json = frame::encode(FrameKind::Json, &vec![b' '; MAX_JSON + 1]).unwrap();
    let cases: Vec<(&str, Vec<u8>, Option<AgentErrorCode>)> = vec![
        (
            "length 0xffffffff",
            vec![0xff; 8],
            Some(AgentErrorCode::TooLarge),
        ),
        (
            "payload just over 1 MiB",
            ((1u32 << 20) + 2).to_le_bytes().to_vec(),
            Some(AgentErrorCode::TooLarge),
        ),
        (
            "length 0",
            vec![0, 0, 0, 0],
            Some(AgentErrorCode::InvalidInput),
        ),
        (
            "unknown kind",
            vec![1, 0, 0, 0, 9],
            Some(AgentErrorCode::InvalidInput),
        ),
        (
            "truncated frame",
            vec![10, 0, 0, 0, 1, b'{'],
            Some(AgentErrorCode::InvalidInput),
        ),
        (
            "bad JSON",
            json("{\"type\":"),
            Some(AgentErrorCode::InvalidInput),
        ),
        (
            "not an object",
            json("[1,2]"),
            Some(AgentErrorCode::InvalidInput),
        ),
        (
            "oversized JSON",
            oversized_json.clone(),
            Some(AgentErrorCode::TooLarge),
        ),
        (
            "request before hello",
            json(r#"{"type":"ping"}"#),
            Some(AgentErrorCode::InvalidInput),
        ),
        (
            "stdout frame first",
            frame::encode(FrameKind::Stdout, b"x").unwrap(),
            Some(AgentErrorCode::InvalidInput),
        ),
        (
            "unknown type",
            with_hello(&json(r#"{"type":"frobnicate"}"#)),
            Some(AgentErrorCode::InvalidInput),
        ),
        (
            "missing field",
            with_hello(&json(r#"{"type":"stat"}"#)),
            Some(AgentErrorCode::InvalidInput),
        ),
        (
            "bad JSON after hello",
            with_hello(&json("nope")),
            Some(AgentErrorCode::InvalidInput),
        ),
        (
            "oversized JSON after hello",
            with_hello(&oversized_json),
            Some(AgentErrorCode::TooLarge),
        ),
        (
            "second hello",
            with_hello(&hello_bytes(PROTOCOL_VERSION)),
            Some(AgentErrorCode::InvalidInput),
        ),
    ];
    for (name, bytes, code) in cases {
        let frames = exchange(&agent, &bytes);
        assert_eq!(error_code(&frames), code, "{name}: {frames:?}");
        ping(&agent);
    }
    // Random bytes: an error or a close, never a crash.
    for seed in 1..=30u64 {
        let junk = common::random_bytes(seed, 1 + (seed as usize * 37) % 300);
        exchange(&agent, &junk);
    }
    ping(&agent);
    assert!(!agent.log().contains("panicked"), "{}", agent.log());
}

#[test]
fn a_client_that_stalls_mid_upload_is_dropped_and_nothing_is_left() {
    let agent = Agent::start_with(&["--idle-timeout-ms", "300"]);
    let target = agent.path("stalled");
    let mut bytes = with_hello(
        &frame::encode_json(&Request::WriteFile {
            path: target.clone(),
            mode: WriteMode::Create,
            perm: None,
        })
        .unwrap(),
    );
    bytes.extend(frame::encode(FrameKind::Data, b"partial").unwrap());
    let mut s = agent.raw();
    s.write_all(&bytes).unwrap();
    let start = Instant::now();
    // No end frame, no close: silence.
    let frames = read_all(&mut s);
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(
        error_code(&frames),
        Some(AgentErrorCode::Timeout),
        "{frames:?}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(agent.files()).unwrap().collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    ping(&agent);
}

#[test]
fn a_silent_client_is_dropped_before_hello() {
    let agent = Agent::start_with(&["--idle-timeout-ms", "200"]);
    let mut s = agent.raw();
    let frames = read_all(&mut s);
    assert_eq!(
        error_code(&frames),
        Some(AgentErrorCode::Timeout),
        "{frames:?}"
    );
}

#[test]
fn over_the_connection_limit_the_agent_says_so() {
    let agent = Agent::start_with(&["--max-connections", "1"]);
    // One connection held open (waiting for hello)...
    let _held = agent.raw();
    std::thread::sleep(Duration::from_millis(100));
    // ...so the next gets TOO_LARGE at once.
    let frames = exchange(&agent, &hello_bytes(PROTOCOL_VERSION));
    assert_eq!(
        error_code(&frames),
        Some(AgentErrorCode::TooLarge),
        "{frames:?}"
    );
}
