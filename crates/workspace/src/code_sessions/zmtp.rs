//! ZMTP 3.0 (rfc.zeromq.org/spec/23), NULL security, over any byte
//! stream: the DEALER and SUB ends a Jupyter client needs. The streams are
//! the agent's `tcp_connect` tunnels into the guest, which no ZeroMQ
//! library takes; everything the peer (a kernel in the guest) sends is
//! hostile and bounded here.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest message taken from a peer, all frames together.
pub const MAX_MESSAGE_BYTES: usize = 20 * 1024 * 1024;
/// Most frames of one message.
pub const MAX_FRAMES: usize = 64;
/// Largest command (READY and the like).
const MAX_COMMAND_BYTES: usize = 4096;
/// Commands (a peer's PING) passed over between two messages.
const MAX_COMMANDS_BETWEEN: usize = 16;

const GREETING_LEN: usize = 64;
const FLAG_MORE: u8 = 0x01;
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;

/// Why a ZMTP exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZmtpError {
    /// The stream failed or closed.
    #[error("the connection failed")]
    Io(#[source] std::io::Error),
    /// The peer's greeting is not ZMTP 3 with NULL security.
    #[error("the peer does not speak ZMTP 3 with NULL security: {0}")]
    Greeting(String),
    /// The peer's handshake command is not a READY for a matching socket.
    #[error("the peer's handshake is not acceptable: {0}")]
    Handshake(String),
    /// A frame or message is over the bounds.
    #[error("the peer sent a message over {limit} ({what})")]
    Oversized {
        /// What was over.
        what: &'static str,
        /// The bound.
        limit: usize,
    },
}

/// The socket type this end speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketType {
    /// Requests to a ROUTER (a kernel's shell and control).
    Dealer,
    /// Everything a PUB publishes (a kernel's iopub).
    Sub,
}

impl SocketType {
    fn name(self) -> &'static str {
        match self {
            Self::Dealer => "DEALER",
            Self::Sub => "SUB",
        }
    }

    fn accepts(self, peer: &[u8]) -> bool {
        match self {
            Self::Dealer => matches!(peer, b"ROUTER" | b"DEALER"),
            Self::Sub => matches!(peer, b"PUB" | b"XPUB"),
        }
    }
}

/// One ZMTP connection. `recv` is cancel-safe: what it has read of a
/// message waits in the buffer for the next call.
/// The most buffer capacity [`Zmtp::compact`] leaves.
const KEPT_BUFFER: usize = 64 * 1024;

pub struct Zmtp<S> {
    stream: S,
    buf: Vec<u8>,
    /// Bytes of `buf` already taken (dropped at the next read, so taking
    /// many small commands costs no copy each).
    taken: usize,
    /// Commands taken since the last message.
    commands: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Zmtp<S> {
    /// Greets the peer, exchanges READY, and for a SUB subscribes to every
    /// topic.
    pub async fn handshake(mut stream: S, kind: SocketType) -> Result<Self, ZmtpError> {
        stream.write_all(&greeting()).await.map_err(ZmtpError::Io)?;
        stream
            .write_all(&ready_command(kind))
            .await
            .map_err(ZmtpError::Io)?;
        stream.flush().await.map_err(ZmtpError::Io)?;
        let mut theirs = [0u8; GREETING_LEN];
        stream
            .read_exact(&mut theirs)
            .await
            .map_err(ZmtpError::Io)?;
        check_greeting(&theirs)?;
        let mut zmtp = Self {
            stream,
            buf: Vec::new(),
            taken: 0,
            commands: 0,
        };
        let command = zmtp.next_command().await?;
        check_ready(&command, kind)?;
        if kind == SocketType::Sub {
            // ZMTP 3.0's subscription: a message of 0x01 and the topic
            // (empty: all).
            zmtp.send(&[&[1u8][..]]).await?;
        }
        Ok(zmtp)
    }

    /// Sends one message of `frames`.
    pub async fn send(&mut self, frames: &[&[u8]]) -> Result<(), ZmtpError> {
        let mut out = Vec::with_capacity(frames.iter().map(|f| f.len() + 9).sum());
        for (i, frame) in frames.iter().enumerate() {
            let more = if i + 1 < frames.len() { FLAG_MORE } else { 0 };
            push_frame(&mut out, more, frame);
        }
        self.stream.write_all(&out).await.map_err(ZmtpError::Io)?;
        self.stream.flush().await.map_err(ZmtpError::Io)
    }

    /// The next message; commands between messages (a peer's PING) are
    /// read and passed over.
    pub async fn recv(&mut self) -> Result<Vec<Vec<u8>>, ZmtpError> {
        // A peer that floods cannot keep this task from yielding.
        tokio::task::consume_budget().await;
        loop {
            match parse(&self.buf[self.taken..])? {
                Some(Parsed::Message(frames, used)) => {
                    self.taken += used;
                    self.commands = 0;
                    return Ok(frames);
                }
                Some(Parsed::Command(_, used)) => {
                    self.taken += used;
                    self.commands += 1;
                    if self.commands > MAX_COMMANDS_BETWEEN {
                        return Err(ZmtpError::Handshake(format!(
                            "over {MAX_COMMANDS_BETWEEN} commands without a message"
                        )));
                    }
                }
                None => self.fill().await?,
            }
        }
    }

    async fn next_command(&mut self) -> Result<Vec<u8>, ZmtpError> {
        loop {
            match parse(&self.buf[self.taken..])? {
                Some(Parsed::Command(body, used)) => {
                    self.taken += used;
                    return Ok(body);
                }
                Some(Parsed::Message(..)) => {
                    return Err(ZmtpError::Handshake("a message before READY".into()));
                }
                None => self.fill().await?,
            }
        }
    }

    /// Whether nothing waits to be read: nothing buffered and nothing the
    /// stream has now (what it has is buffered, framing kept); an error
    /// when the stream has ended.
    pub(crate) fn quiet(&mut self) -> Result<bool, ZmtpError> {
        use futures_util::FutureExt;
        if self.buf.len() > self.taken {
            return Ok(false);
        }
        match self.fill().now_or_never() {
            None => Ok(true),
            Some(read) => read.map(|()| false),
        }
    }

    /// Gives back what a large message left the buffer holding, once
    /// everything in it was taken (a connection kept idle holds little).
    pub(crate) fn compact(&mut self) {
        if self.buf.len() == self.taken {
            self.buf.clear();
            self.taken = 0;
            self.buf.shrink_to(KEPT_BUFFER);
        }
    }

    /// Reads what the stream has into the buffer (cancel-safe: `read_buf`
    /// takes nothing it does not put there).
    async fn fill(&mut self) -> Result<(), ZmtpError> {
        self.buf.drain(..self.taken);
        self.taken = 0;
        self.buf.reserve(64 * 1024);
        let n = self
            .stream
            .read_buf(&mut self.buf)
            .await
            .map_err(ZmtpError::Io)?;
        if n == 0 {
            return Err(ZmtpError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        Ok(())
    }
}

/// The peer's end for tests: greets as a `socket_type` (ROUTER, PUB),
/// takes the other side's greeting and READY without a look.
#[cfg(test)]
pub(crate) async fn peer_for_tests<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    socket_type: &str,
) -> Zmtp<S> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    let mut out = greeting().to_vec();
    push_frame(&mut out, FLAG_COMMAND, &body);
    stream.write_all(&out).await.unwrap();
    let mut theirs = [0u8; GREETING_LEN];
    stream.read_exact(&mut theirs).await.unwrap();
    let mut zmtp = Zmtp {
        stream,
        buf: Vec::new(),
        taken: 0,
        commands: 0,
    };
    zmtp.next_command().await.unwrap();
    zmtp
}

fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3; // version 3.0
    g[12..16].copy_from_slice(b"NULL");
    g
}

fn check_greeting(g: &[u8; GREETING_LEN]) -> Result<(), ZmtpError> {
    if g[0] != 0xff || g[9] & 0x01 != 0x01 {
        return Err(ZmtpError::Greeting("no ZMTP signature".into()));
    }
    if g[10] < 3 {
        return Err(ZmtpError::Greeting(format!("version {}.{}", g[10], g[11])));
    }
    let mechanism = &g[12..32];
    let end = mechanism.iter().position(|&b| b == 0).unwrap_or(20);
    if &mechanism[..end] != b"NULL" {
        return Err(ZmtpError::Greeting(format!(
            "security mechanism {}",
            String::from_utf8_lossy(&mechanism[..end])
        )));
    }
    Ok(())
}

fn ready_command(kind: SocketType) -> Vec<u8> {
    let mut body = Vec::new();
    body.push(5);
    body.extend_from_slice(b"READY");
    let mut property = |name: &[u8], value: &[u8]| {
        body.push(name.len() as u8);
        body.extend_from_slice(name);
        body.extend_from_slice(&(value.len() as u32).to_be_bytes());
        body.extend_from_slice(value);
    };
    property(b"Socket-Type", kind.name().as_bytes());
    if kind == SocketType::Dealer {
        property(b"Identity", b"");
    }
    let mut out = Vec::new();
    push_frame(&mut out, FLAG_COMMAND, &body);
    out
}

/// Checks a READY command's body and its `Socket-Type`.
fn check_ready(body: &[u8], kind: SocketType) -> Result<(), ZmtpError> {
    let bad = |why: &str| ZmtpError::Handshake(why.to_owned());
    let (&name_len, rest) = body.split_first().ok_or_else(|| bad("an empty command"))?;
    let name = rest
        .get(..name_len as usize)
        .ok_or_else(|| bad("a cut command name"))?;
    if name != b"READY" {
        return Err(bad(&format!(
            "{} instead of READY",
            String::from_utf8_lossy(name)
        )));
    }
    let mut props = &rest[name_len as usize..];
    let mut socket_type = None;
    while let Some((&len, rest)) = props.split_first() {
        let key = rest
            .get(..len as usize)
            .ok_or_else(|| bad("a cut property"))?;
        let rest = &rest[len as usize..];
        let size = rest
            .get(..4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| bad("a cut property size"))?;
        let value = rest.get(4..4 + size).ok_or_else(|| bad("a cut property"))?;
        if key.eq_ignore_ascii_case(b"Socket-Type") {
            socket_type = Some(value);
        }
        props = &rest[4 + size..];
    }
    match socket_type {
        Some(peer) if kind.accepts(peer) => Ok(()),
        Some(peer) => Err(bad(&format!(
            "a {} cannot talk to a {}",
            kind.name(),
            String::from_utf8_lossy(peer)
        ))),
        None => Err(bad("no Socket-Type")),
    }
}

fn push_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    if body.len() > 255 {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}

enum Parsed {
    /// A message's frames and the bytes they took.
    Message(Vec<Vec<u8>>, usize),
    /// A command's body and the bytes it took.
    Command(Vec<u8>, usize),
}

/// The first whole message or command in `buf`, or `None` until it has
/// come; over-large ones are refused as soon as their sizes say so.
fn parse(buf: &[u8]) -> Result<Option<Parsed>, ZmtpError> {
    let mut at = 0;
    let mut frames = Vec::new();
    let mut total = 0usize;
    loop {
        let Some(&flags) = buf.get(at) else {
            return Ok(None);
        };
        let (size, head) = if flags & FLAG_LONG != 0 {
            let Some(b) = buf.get(at + 1..at + 9) else {
                return Ok(None);
            };
            let size = u64::from_be_bytes(b.try_into().unwrap_or([0xff; 8]));
            (usize::try_from(size).unwrap_or(usize::MAX), 9)
        } else {
            let Some(&b) = buf.get(at + 1) else {
                return Ok(None);
            };
            (b as usize, 2)
        };
        if flags & FLAG_COMMAND != 0 {
            if !frames.is_empty() {
                return Err(ZmtpError::Handshake("a command inside a message".into()));
            }
            if size > MAX_COMMAND_BYTES {
                return Err(ZmtpError::Oversized {
                    what: "a command",
                    limit: MAX_COMMAND_BYTES,
                });
            }
            let Some(body) = buf.get(at + head..at + head + size) else {
                return Ok(None);
            };
            return Ok(Some(Parsed::Command(body.to_vec(), at + head + size)));
        }
        total = total.saturating_add(size);
        if total > MAX_MESSAGE_BYTES {
            return Err(ZmtpError::Oversized {
                what: "a message",
                limit: MAX_MESSAGE_BYTES,
            });
        }
        if frames.len() == MAX_FRAMES {
            return Err(ZmtpError::Oversized {
                what: "frames of a message",
                limit: MAX_FRAMES,
            });
        }
        if buf.len() < at + head + size {
            return Ok(None);
        }
        // Copied only once the whole message is in (no copy per read).
        frames.push(at + head..at + head + size);
        at += head + size;
        if flags & FLAG_MORE == 0 {
            let frames = frames.into_iter().map(|r| buf[r].to_vec()).collect();
            return Ok(Some(Parsed::Message(frames, at)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_short_and_long() {
        let mut out = Vec::new();
        push_frame(&mut out, FLAG_MORE, b"short");
        push_frame(&mut out, 0, &[7u8; 300]);
        let Some(Parsed::Message(frames, used)) = parse(&out).unwrap() else {
            panic!("a whole message");
        };
        assert_eq!(used, out.len());
        assert_eq!(frames, vec![b"short".to_vec(), vec![7u8; 300]]);
        // Every cut of it is "not yet", never an error or a message.
        for cut in 0..out.len() {
            assert!(parse(&out[..cut]).unwrap().is_none(), "{cut}");
        }
    }

    #[tokio::test]
    async fn a_flood_of_empty_commands_is_refused() {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let peer = tokio::spawn(async move {
            let mut peer = peer_for_tests(theirs, "ROUTER").await;
            let mut flood = Vec::new();
            for _ in 0..MAX_COMMANDS_BETWEEN {
                push_frame(&mut flood, FLAG_COMMAND, b"");
            }
            push_frame(&mut flood, 0, b"after a few");
            for _ in 0..100_000 {
                push_frame(&mut flood, FLAG_COMMAND, b"");
            }
            peer.stream.write_all(&flood).await.unwrap();
            peer
        });
        let mut zmtp = Zmtp::handshake(ours, SocketType::Dealer).await.unwrap();
        // A few commands between messages are passed over...
        assert_eq!(zmtp.recv().await.unwrap(), vec![b"after a few".to_vec()]);
        // ... a flood of them is refused, in time linear in its bytes.
        let began = std::time::Instant::now();
        assert!(matches!(zmtp.recv().await, Err(ZmtpError::Handshake(_))));
        assert!(began.elapsed() < std::time::Duration::from_secs(5));
        drop(peer.await.unwrap());
    }

    #[tokio::test]
    async fn a_kept_stream_says_whether_anything_came_and_keeps_it_whole() {
        let (ours, theirs) = tokio::io::duplex(1 << 22);
        let peer = tokio::spawn(peer_for_tests(theirs, "PUB"));
        let mut zmtp = Zmtp::handshake(ours, SocketType::Sub).await.unwrap();
        let mut peer = peer.await.unwrap();
        assert!(zmtp.quiet().unwrap(), "nothing came");
        // A large message taken, then given back to a small buffer.
        let big = vec![7u8; 3 << 20];
        peer.send(&[&big]).await.unwrap();
        assert_eq!(zmtp.recv().await.unwrap(), vec![big]);
        zmtp.compact();
        assert!(
            zmtp.buf.capacity() <= KEPT_BUFFER,
            "{}",
            zmtp.buf.capacity()
        );
        // What came while kept is seen, and still read as it was sent.
        peer.send(&[b"while kept"]).await.unwrap();
        tokio::task::yield_now().await;
        assert!(!zmtp.quiet().unwrap());
        assert_eq!(zmtp.recv().await.unwrap(), vec![b"while kept".to_vec()]);
        assert!(zmtp.quiet().unwrap());
        // A stream that ended is an error.
        drop(peer);
        assert!(zmtp.quiet().is_err());
    }

    #[test]
    fn oversized_messages_and_commands_are_refused_from_their_sizes() {
        let mut huge = vec![FLAG_LONG];
        huge.extend_from_slice(&u64::MAX.to_be_bytes());
        assert!(matches!(parse(&huge), Err(ZmtpError::Oversized { .. })));
        let mut command = vec![FLAG_COMMAND | FLAG_LONG];
        command.extend_from_slice(&(1u64 << 20).to_be_bytes());
        assert!(matches!(parse(&command), Err(ZmtpError::Oversized { .. })));
        let mut many = Vec::new();
        for _ in 0..=MAX_FRAMES {
            push_frame(&mut many, FLAG_MORE, b"x");
        }
        assert!(matches!(parse(&many), Err(ZmtpError::Oversized { .. })));
        let mut inside = Vec::new();
        push_frame(&mut inside, FLAG_MORE, b"x");
        push_frame(&mut inside, FLAG_COMMAND, b"\x04PING");
        assert!(matches!(parse(&inside), Err(ZmtpError::Handshake(_))));
    }

    #[test]
    fn greetings_and_ready_are_checked() {
        assert!(check_greeting(&greeting()).is_ok());
        let mut old = greeting();
        old[10] = 2;
        assert!(check_greeting(&old).is_err());
        let mut curve = greeting();
        curve[12..17].copy_from_slice(b"CURVE");
        assert!(check_greeting(&curve).is_err());
        let ready = |kind| {
            let Some(Parsed::Command(body, _)) = parse(&ready_command(kind)).unwrap() else {
                panic!("a command");
            };
            body
        };
        // Ours as the peer's: a DEALER talks to a DEALER, not a SUB.
        assert!(check_ready(&ready(SocketType::Dealer), SocketType::Dealer).is_ok());
        assert!(check_ready(&ready(SocketType::Sub), SocketType::Dealer).is_err());
        // Cut or garbage bodies fail as handshakes, never panic.
        let body = ready(SocketType::Dealer);
        for cut in 0..body.len() {
            let _ = check_ready(&body[..cut], SocketType::Dealer);
        }
        assert!(check_ready(b"\xffREADY", SocketType::Dealer).is_err());
        assert!(check_ready(
            b"\x05READY\x0bSocket-Type\xff\xff\xff\xffPUB",
            SocketType::Sub
        )
        .is_err());
    }
}
