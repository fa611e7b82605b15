//! One client connection: frames in and out, with the idle timeout, and the
//! kind-5 data streams as `Read`/`Write`.
//!
//! Vsock connections are held in a std `UnixStream`: it is a thin wrapper
//! over a stream socket descriptor, and read, write, shutdown and the
//! SO_RCVTIMEO/SO_SNDTIMEO timeouts are the same calls for AF_VSOCK.
//!
//! Reads go through a small buffer: a client sends `hello` and its request
//! in one write, and each read is a syscall of the emulated guest kernel.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use guest_agent::frame::{self, Frame, FrameError, FrameKind};
use guest_agent::protocol::{AgentErrorCode, Response, DATA_CHUNK};

/// Longest the agent keeps reading (and discarding) what a client still
/// sends after the answer, so the client gets to read that answer.
const DRAIN_TIME: Duration = Duration::from_secs(1);
/// Most bytes discarded that way.
const DRAIN_BYTES: u64 = 16 << 20;

/// Size of a connection's read buffer: requests are small; bigger reads
/// (data frames) bypass it.
const READ_BUFFER: usize = 4 << 10;

/// A client connection.
#[derive(Debug)]
pub struct Conn {
    stream: UnixStream,
    inbound: Inbound,
    /// Both directions shut down: nothing left to drain.
    closed: bool,
    /// Encoded messages held back to go out with the next write (an exec's
    /// `hello` leaves with its `started`: each write is a virtio transmit
    /// through the emulated guest kernel).
    pending: Vec<u8>,
}

/// Bytes read from the socket and not yet consumed.
#[derive(Debug, Default)]
struct Inbound {
    buf: Vec<u8>,
    pos: usize,
}

impl Conn {
    /// Wraps an accepted stream; reads and writes time out after `idle`.
    pub fn new(stream: UnixStream, idle: Duration) -> io::Result<Self> {
        stream.set_read_timeout(Some(idle))?;
        stream.set_write_timeout(Some(idle))?;
        Ok(Self {
            stream,
            inbound: Inbound::default(),
            closed: false,
            pending: Vec::new(),
        })
    }

    /// A second handle on the same socket that takes over reading: the
    /// bytes this one has buffered go with it (the client may have sent
    /// stdin frames with its request).
    pub fn split_reader(&mut self) -> io::Result<Self> {
        Ok(Self {
            stream: self.stream.try_clone()?,
            inbound: std::mem::take(&mut self.inbound),
            closed: false,
            pending: Vec::new(),
        })
    }

    /// A plain handle on the socket, for a connection that becomes a byte
    /// pipe (`tcp_connect`), and the bytes already read from it.
    pub fn raw_stream(&mut self) -> io::Result<(UnixStream, Vec<u8>)> {
        self.flush_pending().map_err(frame_to_io)?;
        let inbound = std::mem::take(&mut self.inbound);
        Ok((
            self.stream.try_clone()?,
            inbound.buf[inbound.pos..].to_vec(),
        ))
    }

    /// Sets the receive timeout (`None`: wait forever).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }

    /// Reads one frame; `None` when the client closed.
    pub fn read_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        frame::read_frame(&mut BufferedReader {
            stream: &self.stream,
            inbound: &mut self.inbound,
        })
    }

    /// Sends one JSON message (with anything held back).
    pub fn send(&mut self, msg: &Response) -> Result<(), FrameError> {
        let bytes = frame::encode_json(msg)?;
        self.write_out(bytes)
    }

    /// Holds `msg` back to leave with the next message or frame.
    pub fn send_later(&mut self, msg: &Response) -> Result<(), FrameError> {
        let bytes = frame::encode_json(msg)?;
        self.pending.extend_from_slice(&bytes);
        Ok(())
    }

    /// Sends what is held back now.
    pub fn flush_pending(&mut self) -> Result<(), FrameError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let bytes = std::mem::take(&mut self.pending);
        (&self.stream).write_all(&bytes).map_err(FrameError::Write)
    }

    /// Whether the client already sent more than was read (its request
    /// came with its `hello`).
    pub fn has_buffered_input(&self) -> bool {
        self.inbound.pos < self.inbound.buf.len()
    }

    /// Sends one frame (with anything held back).
    pub fn send_frame(&mut self, kind: FrameKind, payload: &[u8]) -> Result<(), FrameError> {
        let bytes = frame::encode(kind, payload)?;
        self.write_out(bytes)
    }

    fn write_out(&mut self, bytes: Vec<u8>) -> Result<(), FrameError> {
        let bytes = if self.pending.is_empty() {
            bytes
        } else {
            let mut all = std::mem::take(&mut self.pending);
            all.extend_from_slice(&bytes);
            all
        };
        (&self.stream).write_all(&bytes).map_err(FrameError::Write)
    }

    /// Sends an `error` message.
    pub fn send_error(&mut self, code: AgentErrorCode, message: String) -> Result<(), FrameError> {
        self.send(&Response::Error { code, message })
    }

    /// Shuts the socket down (wakes every thread blocked on it).
    pub fn shutdown(&mut self, how: Shutdown) {
        // Already shut down or reset by the client: nothing left to do.
        let _ = self.stream.shutdown(how);
        self.closed |= how == Shutdown::Both;
    }

    /// Ends the connection: no more output, then discard what the client
    /// still sends (pipelined frames of a refused request) for a moment so
    /// that it can read the answer before the socket closes.
    pub fn finish(mut self) {
        if self.closed {
            return;
        }
        let _ = self.flush_pending();
        self.shutdown(Shutdown::Write);
        let deadline = Instant::now() + DRAIN_TIME;
        let mut discarded = 0u64;
        let mut buf = [0u8; 16 << 10];
        while discarded < DRAIN_BYTES {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.stream.set_read_timeout(Some(left)).is_err() {
                break;
            }
            match (&self.stream).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => discarded += n as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }

    /// The kind-5 stream the client sends, as a reader.
    pub fn data_reader(&mut self) -> DataReader<'_> {
        DataReader {
            conn: self,
            buf: Vec::new(),
            pos: 0,
            ended: false,
            failure: None,
        }
    }

    /// A kind-5 stream to the client, as a writer.
    pub fn data_writer(&mut self) -> DataWriter<'_> {
        DataWriter {
            conn: self,
            buf: Vec::with_capacity(DATA_CHUNK),
        }
    }
}

/// Reads the payloads of kind-5 frames until the empty one.
#[derive(Debug)]
pub struct DataReader<'a> {
    conn: &'a mut Conn,
    buf: Vec<u8>,
    pos: usize,
    ended: bool,
    failure: Option<FrameError>,
}

impl DataReader<'_> {
    /// Why reading failed, when it failed at the frame level (the
    /// `io::Error` returned by `read` only says "see here").
    pub fn take_failure(&mut self) -> Option<FrameError> {
        self.failure.take()
    }

    /// Reads and discards the rest of the stream, up to its empty frame.
    pub fn drain(&mut self) -> io::Result<()> {
        let mut sink = [0u8; 16 << 10];
        while self.read(&mut sink)? > 0 {}
        Ok(())
    }

    fn fail(&mut self, e: FrameError) -> io::Error {
        let err = io::Error::other(e.to_string());
        self.failure = Some(e);
        err
    }
}

impl Read for DataReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            if self.ended {
                return Ok(0);
            }
            match self.conn.read_frame() {
                Ok(Some(f)) if f.kind == FrameKind::Data && f.payload.is_empty() => {
                    self.ended = true;
                }
                Ok(Some(f)) if f.kind == FrameKind::Data => {
                    self.buf = f.payload;
                    self.pos = 0;
                }
                Ok(Some(f)) => {
                    return Err(self.fail(FrameError::UnexpectedKind {
                        expected: FrameKind::Data,
                        got: f.kind,
                    }))
                }
                Ok(None) => return Err(self.fail(FrameError::Truncated)),
                Err(e) => return Err(self.fail(e)),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Buffers bytes into kind-5 frames of up to [`DATA_CHUNK`].
#[derive(Debug)]
pub struct DataWriter<'a> {
    conn: &'a mut Conn,
    buf: Vec<u8>,
}

impl DataWriter<'_> {
    /// Sends what is buffered and the empty frame that ends the stream.
    pub fn finish(mut self) -> io::Result<()> {
        self.flush()?;
        self.conn
            .send_frame(FrameKind::Data, &[])
            .map_err(frame_to_io)
    }
}

impl Write for DataWriter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(DATA_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == DATA_CHUNK {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.conn
                .send_frame(FrameKind::Data, &self.buf)
                .map_err(frame_to_io)?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// Reads through a connection's buffer.
struct BufferedReader<'a> {
    stream: &'a UnixStream,
    inbound: &'a mut Inbound,
}

impl Read for BufferedReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let inbound = &mut *self.inbound;
        if inbound.pos == inbound.buf.len() {
            if out.len() >= READ_BUFFER {
                return self.stream.read(out);
            }
            inbound.buf.resize(READ_BUFFER, 0);
            let n = match self.stream.read(&mut inbound.buf) {
                Ok(n) => n,
                Err(e) => {
                    inbound.buf.clear();
                    inbound.pos = 0;
                    return Err(e);
                }
            };
            inbound.buf.truncate(n);
            inbound.pos = 0;
        }
        let n = out.len().min(inbound.buf.len() - inbound.pos);
        out[..n].copy_from_slice(&inbound.buf[inbound.pos..inbound.pos + n]);
        inbound.pos += n;
        Ok(n)
    }
}

fn frame_to_io(e: FrameError) -> io::Error {
    match e {
        FrameError::Read(e) | FrameError::Write(e) => e,
        other => io::Error::other(other.to_string()),
    }
}
