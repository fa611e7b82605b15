//! Framing: a u32 little-endian length of the rest, one kind byte, then the
//! payload. These functions are blocking (std::io); the client has async
//! twins built on [`payload_len`] and [`FrameKind::from_byte`].

use std::io::{self, Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::protocol::AgentErrorCode;

/// Largest frame payload (kind byte excluded).
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Largest JSON message.
pub const MAX_JSON: usize = 64 << 10;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// A JSON message.
    Json = 1,
    /// Exec stdout bytes (agent to client).
    Stdout = 2,
    /// Exec stderr bytes (agent to client).
    Stderr = 3,
    /// Exec stdin bytes (client to agent); empty means EOF.
    Stdin = 4,
    /// File or tar bytes (either way); empty ends the stream.
    Data = 5,
}

impl FrameKind {
    /// The kind for a wire byte.
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Json,
            2 => Self::Stdout,
            3 => Self::Stderr,
            4 => Self::Stdin,
            5 => Self::Data,
            _ => return None,
        })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What it carries.
    pub kind: FrameKind,
    /// The bytes.
    pub payload: Vec<u8>,
}

/// Why a frame could not be read, written or decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The underlying read failed (including a receive timeout).
    #[error("reading a frame")]
    Read(#[source] io::Error),
    /// The underlying write failed.
    #[error("writing a frame")]
    Write(#[source] io::Error),
    /// The stream ended inside a frame.
    #[error("the stream ended inside a frame")]
    Truncated,
    /// A length of 0 leaves no room for the kind byte.
    #[error("frame length 0 has no kind byte")]
    ZeroLength,
    /// The payload is over [`MAX_PAYLOAD`] (or a JSON message over [`MAX_JSON`]).
    #[error("frame payload of {len} bytes is over the {max}-byte limit")]
    TooLarge {
        /// The announced payload length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// The kind byte is not 1-5.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A frame of another kind was expected here.
    #[error("expected a {expected:?} frame, got {got:?}")]
    UnexpectedKind {
        /// What the protocol allows at this point.
        expected: FrameKind,
        /// What came.
        got: FrameKind,
    },
    /// A JSON frame did not hold a message of the expected shape.
    #[error("malformed JSON message")]
    BadJson(#[source] serde_json::Error),
}

impl FrameError {
    /// The protocol error code for this failure.
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::Read(e) | Self::Write(e) => match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => AgentErrorCode::Timeout,
                _ => AgentErrorCode::Internal,
            },
            Self::TooLarge { .. } => AgentErrorCode::TooLarge,
            Self::Truncated
            | Self::ZeroLength
            | Self::UnknownKind(_)
            | Self::UnexpectedKind { .. }
            | Self::BadJson(_) => AgentErrorCode::InvalidInput,
        }
    }

    /// True when the peer went away or stayed silent (nobody to answer).
    pub fn is_disconnect(&self) -> bool {
        match self {
            Self::Read(e) | Self::Write(e) => matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::NotConnected
                    | io::ErrorKind::UnexpectedEof
            ),
            _ => false,
        }
    }
}

/// The payload length announced by a frame's length word (which counts the
/// kind byte too), checked against [`MAX_PAYLOAD`].
pub fn payload_len(length_word: u32) -> Result<usize, FrameError> {
    let Some(len) = (length_word as usize).checked_sub(1) else {
        return Err(FrameError::ZeroLength);
    };
    if len > MAX_PAYLOAD {
        return Err(FrameError::TooLarge {
            len: len as u64,
            max: MAX_PAYLOAD,
        });
    }
    Ok(len)
}

/// A frame's bytes: header and payload in one buffer (one write, so a
/// frame is one vsock packet where it fits).
pub fn encode(kind: FrameKind, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(FrameError::TooLarge {
            len: payload.len() as u64,
            max: MAX_PAYLOAD,
        });
    }
    let mut out = Vec::with_capacity(5 + payload.len());
    // Cannot truncate: the payload is at most MAX_PAYLOAD.
    out.extend_from_slice(&((payload.len() + 1) as u32).to_le_bytes());
    out.push(kind as u8);
    out.extend_from_slice(payload);
    Ok(out)
}

/// A JSON frame holding `msg`, checked against [`MAX_JSON`].
pub fn encode_json<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let json = serde_json::to_vec(msg).map_err(FrameError::BadJson)?;
    if json.len() > MAX_JSON {
        return Err(FrameError::TooLarge {
            len: json.len() as u64,
            max: MAX_JSON,
        });
    }
    encode(FrameKind::Json, &json)
}

/// Decodes the payload of a JSON frame.
pub fn decode_json<T: DeserializeOwned>(frame: &Frame) -> Result<T, FrameError> {
    if frame.kind != FrameKind::Json {
        return Err(FrameError::UnexpectedKind {
            expected: FrameKind::Json,
            got: frame.kind,
        });
    }
    if frame.payload.len() > MAX_JSON {
        return Err(FrameError::TooLarge {
            len: frame.payload.len() as u64,
            max: MAX_JSON,
        });
    }
    serde_json::from_slice(&frame.payload).map_err(FrameError::BadJson)
}

/// Writes one frame.
pub fn write_frame<W: Write + ?Sized>(
    w: &mut W,
    kind: FrameKind,
    payload: &[u8],
) -> Result<(), FrameError> {
    let bytes = encode(kind, payload)?;
    w.write_all(&bytes).map_err(FrameError::Write)
}

/// Writes one JSON message.
pub fn write_json<W: Write + ?Sized, T: Serialize>(w: &mut W, msg: &T) -> Result<(), FrameError> {
    let bytes = encode_json(msg)?;
    w.write_all(&bytes).map_err(FrameError::Write)
}

/// Reads one frame; `None` on a clean end of stream (before any byte of a
/// frame). Never allocates more than [`MAX_PAYLOAD`].
pub fn read_frame<R: Read + ?Sized>(r: &mut R) -> Result<Option<Frame>, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Read(e)),
        }
    }
    let payload_len = payload_len(u32::from_le_bytes(len))?;
    let mut kind = [0u8];
    read_exact(r, &mut kind)?;
    let kind = FrameKind::from_byte(kind[0]).ok_or(FrameError::UnknownKind(kind[0]))?;
    let mut payload = vec![0u8; payload_len];
    read_exact(r, &mut payload)?;
    Ok(Some(Frame { kind, payload }))
}

fn read_exact<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> Result<(), FrameError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        _ => FrameError::Read(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: a seeded generator, enough for property tests.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    fn random_frame(rng: &mut Rng) -> Frame {
        let kind = FrameKind::from_byte(1 + rng.below(5) as u8).unwrap();
        let len = match rng.below(10) {
            0 => 0,
            1 => MAX_PAYLOAD - rng.below(3) as usize,
            _ => rng.below(4096) as usize,
        };
        Frame {
            kind,
            payload: rng.bytes(len),
        }
    }

    #[test]
    fn random_frames_round_trip_and_truncation_is_an_error() {
        for seed in 1..=40u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let frames: Vec<Frame> = (0..1 + rng.below(8))
                .map(|_| random_frame(&mut rng))
                .collect();
            let mut wire = Vec::new();
            let mut boundaries = vec![0];
            for f in &frames {
                write_frame(&mut wire, f.kind, &f.payload).unwrap();
                boundaries.push(wire.len());
            }
            let mut r = &wire[..];
            for f in &frames {
                assert_eq!(read_frame(&mut r).unwrap().as_ref(), Some(f), "seed {seed}");
            }
            assert!(read_frame(&mut r).unwrap().is_none());

            // Cut the stream anywhere: whole frames still decode, then either
            // a clean end (cut on a boundary) or Truncated.
            for _ in 0..20 {
                let cut = rng.below(wire.len() as u64) as usize;
                let mut r = &wire[..cut];
                let whole = boundaries.iter().filter(|&&b| b <= cut).count() - 1;
                for f in &frames[..whole] {
                    assert_eq!(read_frame(&mut r).unwrap().as_ref(), Some(f));
                }
                match read_frame(&mut r) {
                    Ok(None) => assert!(boundaries.contains(&cut), "seed {seed} cut {cut}"),
                    Err(FrameError::Truncated) => assert!(!boundaries.contains(&cut)),
                    other => panic!("seed {seed} cut {cut}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn random_bytes_never_panic_or_overallocate() {
        let mut rng = Rng(0x5eed);
        for _ in 0..2000 {
            let n = rng.below(64) as usize;
            let junk = rng.bytes(n);
            let mut r = &junk[..];
            while let Ok(Some(_)) = read_frame(&mut r) {}
        }
    }

    #[test]
    fn limits_and_bad_headers_are_reported() {
        let huge = 0xffff_ffffu32.to_le_bytes();
        assert!(matches!(
            read_frame(&mut &huge[..]),
            Err(FrameError::TooLarge { .. })
        ));
        assert!(matches!(
            read_frame(&mut &[0u8, 0, 0, 0][..]),
            Err(FrameError::ZeroLength)
        ));
        assert!(matches!(
            read_frame(&mut &[1u8, 0, 0, 0, 9][..]),
            Err(FrameError::UnknownKind(9))
        ));
        assert!(matches!(
            encode(FrameKind::Data, &vec![0; MAX_PAYLOAD + 1]),
            Err(FrameError::TooLarge { .. })
        ));
        let big_json = serde_json::json!({"type": "x", "pad": "a".repeat(MAX_JSON)});
        assert!(matches!(
            encode_json(&big_json),
            Err(FrameError::TooLarge { .. })
        ));
        let frame = Frame {
            kind: FrameKind::Json,
            payload: b"{not json".to_vec(),
        };
        let err = decode_json::<serde_json::Value>(&frame).unwrap_err();
        assert_eq!(err.code(), AgentErrorCode::InvalidInput);
    }
}
