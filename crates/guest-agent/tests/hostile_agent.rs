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
