//! What a server sends while it answers a workspace call, before the
//! answer: a command's output as it comes, a start's progress. On the wire
//! they are JSON text sequences (RFC 7464): each frame is RS (0x1E), one
//! line of compact JSON and LF; the answer follows without an RS. What a
//! server sends is data: each frame is read into [`CallFrame`] only, at
//! most [`MAX_FRAME_BYTES`] a line.

use std::io;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// The byte that opens a frame.
pub const FRAME_START: u8 = 0x1e;
/// Most bytes of one frame line: a 64 KiB output chunk is about 88 KiB in
/// base64.
pub const MAX_FRAME_BYTES: usize = 256 << 10;

/// One frame of a call's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "frame", rename_all = "snake_case", deny_unknown_fields)]
#[allow(missing_docs)]
pub enum CallFrame {
    /// A command was spawned (its exec id, for signals).
    ExecStarted { exec_id: String, pid: u32 },
    /// A chunk of a command's stdout.
    Stdout {
        #[serde(with = "crate::wire_bytes")]
        data: Vec<u8>,
    },
    /// A chunk of a command's stderr.
    Stderr {
        #[serde(with = "crate::wire_bytes")]
        data: Vec<u8>,
    },
    /// How long a start has waited, and the newest console line.
    StartProgress {
        elapsed_ms: u64,
        console: Option<String>,
    },
    /// A chunk of what a copy out sends: a file's bytes, or a directory's
    /// tar archive.
    Copy {
        #[serde(with = "crate::wire_bytes")]
        data: Vec<u8>,
    },
}

/// Most bytes of output one frame carries (a guest's agent may send more
/// at once; it goes as several frames): about 88 KiB in base64.
pub const MAX_FRAME_DATA: usize = 64 << 10;
/// Most bytes of the console line a progress frame carries.
pub const MAX_FRAME_CONSOLE: usize = 4 << 10;

impl CallFrame {
    /// A command's output (`stderr` or stdout) as frames of at most
    /// [`MAX_FRAME_DATA`] bytes each, so no frame passes
    /// [`MAX_FRAME_BYTES`] however much the guest sent at once.
    pub fn output(stderr: bool, data: &[u8]) -> Vec<CallFrame> {
        data.chunks(MAX_FRAME_DATA)
            .map(|chunk| {
                let data = chunk.to_vec();
                match stderr {
                    true => CallFrame::Stderr { data },
                    false => CallFrame::Stdout { data },
                }
            })
            .collect()
    }

    /// A start's progress, its console line cut to [`MAX_FRAME_CONSOLE`]
    /// bytes (at a character's boundary).
    pub fn start_progress(elapsed_ms: u64, console: Option<String>) -> CallFrame {
        let console = console.map(|mut line| {
            if line.len() > MAX_FRAME_CONSOLE {
                let mut end = MAX_FRAME_CONSOLE;
                while !line.is_char_boundary(end) {
                    end -= 1;
                }
                line.truncate(end);
            }
            line
        });
        CallFrame::StartProgress {
            elapsed_ms,
            console,
        }
    }

    /// The frame as it goes on the wire: RS, compact JSON, LF.
    pub fn to_line(&self) -> Vec<u8> {
        line_of(self)
    }
}

/// What a workspace call brings besides itself (the server's side of
/// [`super::RunStreams`]).
pub struct CallStreams<'a> {
    /// What follows the call on the server's stdin, chunk by chunk; closed
    /// at its end.
    pub stdin: tokio::sync::mpsc::Receiver<Vec<u8>>,
    /// Sends a frame before the answer; false when the caller is gone.
    pub frames: &'a mut (dyn FnMut(CallFrame) -> bool + Send),
}

impl std::fmt::Debug for CallStreams<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallStreams").finish_non_exhaustive()
    }
}

/// Takes the frames of a call as they come; false refuses one (a frame
/// the call does not send, or more than its caller takes), which ends the
/// call.
pub type OnFrame<'a> = &'a mut (dyn FnMut(CallFrame) -> bool + Send);

/// Reads what a server printed: each frame to `on_frame` as it comes, then
/// the answer, of which at most `max_answer + 1` bytes are kept (so the
/// caller can tell one that is too long). A frame line that is too long,
/// cut off, not a [`CallFrame`] or refused by `on_frame` is `InvalidData`.
pub(crate) async fn read_frames_then_answer<R: AsyncBufRead + Unpin>(
    mut reader: R,
    max_answer: u64,
    on_frame: OnFrame<'_>,
) -> io::Result<Vec<u8>> {
    loop {
        let first = reader.fill_buf().await?.first().copied();
        if first != Some(FRAME_START) {
            let mut answer = Vec::new();
            (&mut reader)
                .take(max_answer + 1)
                .read_to_end(&mut answer)
                .await?;
            return Ok(answer);
        }
        let frame = read_frame(&mut reader).await?;
        if !on_frame(frame) {
            return Err(invalid("a frame this call does not take".to_owned()));
        }
    }
}

/// `frame` as it goes on the wire: RS, compact JSON, LF.
fn line_of(frame: &impl Serialize) -> Vec<u8> {
    let mut line = vec![FRAME_START];
    // Frames are strings, numbers and bytes: serializing cannot fail.
    line.extend(serde_json::to_vec(frame).unwrap_or_default());
    line.push(b'\n');
    line
}

fn invalid(detail: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, detail)
}

/// One frame (RS, a line of JSON, LF; at most [`MAX_FRAME_BYTES`]) read
/// into `T` only.
async fn read_frame<T, R>(reader: &mut R) -> io::Result<T>
where
    T: serde::de::DeserializeOwned,
    R: AsyncBufRead + Unpin,
{
    let mut line = Vec::new();
    reader
        .take(MAX_FRAME_BYTES as u64 + 2)
        .read_until(b'\n', &mut line)
        .await?;
    let body = match line.strip_prefix(&[FRAME_START]) {
        Some(body) => body.strip_suffix(b"\n"),
        None => None,
    };
    let Some(body) = body else {
        return Err(invalid(format!(
            "a frame of more than {MAX_FRAME_BYTES} bytes, or one cut off"
        )));
    };
    serde_json::from_slice(body).map_err(|e| invalid(format!("a frame that is not one: {e}")))
}

/// What follows a command's call: its stdin, or a terminal's keys and
/// sizes, as frames (the same framing as [`CallFrame`]). Only
/// [`InputFrame::End`] ends a stdin; input that stops without it was cut,
/// and the command is hung up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "input", rename_all = "snake_case", deny_unknown_fields)]
#[allow(missing_docs)]
pub enum InputFrame {
    /// Bytes of stdin, or typed (at most [`MAX_FRAME_DATA`] a frame).
    Data {
        #[serde(with = "crate::wire_bytes")]
        data: Vec<u8>,
    },
    /// The terminal's new size.
    Resize { rows: u16, cols: u16 },
    /// The end of stdin.
    End {},
}

impl InputFrame {
    /// Bytes as frames of at most [`MAX_FRAME_DATA`] bytes each.
    pub fn data(data: &[u8]) -> impl Iterator<Item = InputFrame> + '_ {
        data.chunks(MAX_FRAME_DATA).map(|chunk| InputFrame::Data {
            data: chunk.to_vec(),
        })
    }

    /// The frame as it goes on the wire: RS, compact JSON, LF.
    pub fn to_line(&self) -> Vec<u8> {
        line_of(self)
    }
}

/// The input frames that follow a call, one by one.
#[derive(Debug)]
pub struct InputFrames {
    reader: tokio::io::BufReader<FollowingInput>,
}

impl InputFrames {
    /// Frames read from `input`.
    pub fn new(input: FollowingInput) -> Self {
        Self {
            reader: tokio::io::BufReader::new(input),
        }
    }

    /// The next frame; `None` where the input ends. What is not a frame is
    /// `InvalidData`.
    pub async fn next(&mut self) -> io::Result<Option<InputFrame>> {
        if self.reader.fill_buf().await?.is_empty() {
            return Ok(None);
        }
        read_frame(&mut self.reader).await.map(Some)
    }
}

/// A writer whose bytes leave as [`CallFrame::Copy`] frames of at most
/// [`MAX_FRAME_DATA`] bytes each (the server's side of a copy out); a
/// frame the caller cannot take is a broken pipe.
pub struct CopyFrames<'a> {
    frames: &'a mut (dyn FnMut(CallFrame) -> bool + Send),
}

impl std::fmt::Debug for CopyFrames<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyFrames").finish_non_exhaustive()
    }
}

impl<'a> CopyFrames<'a> {
    /// Frames sent through `frames`.
    pub fn new(frames: &'a mut (dyn FnMut(CallFrame) -> bool + Send)) -> Self {
        Self { frames }
    }
}

impl tokio::io::AsyncWrite for CopyFrames<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        // No empty frame: the caller takes one as garbled.
        if buf.is_empty() {
            return std::task::Poll::Ready(Ok(0));
        }
        let n = buf.len().min(MAX_FRAME_DATA);
        let data = buf[..n].to_vec();
        std::task::Poll::Ready(match (self.frames)(CallFrame::Copy { data }) {
            true => Ok(n),
            false => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the caller went away",
            )),
        })
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// What follows a call on the server's stdin, as a reader (a copy in's
/// bytes): it ends where that stdin ends, or when its length is known,
/// there; ending before that is `UnexpectedEof` (the connection was cut,
/// not the input done), more is `InvalidData`.
#[derive(Debug)]
pub struct FollowingInput {
    chunks: tokio::sync::mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
    left: Option<u64>,
}

impl FollowingInput {
    /// Reads the chunks `chunks` brings: exactly `bytes` when given.
    pub fn new(chunks: tokio::sync::mpsc::Receiver<Vec<u8>>, bytes: Option<u64>) -> Self {
        Self {
            chunks,
            chunk: Vec::new(),
            at: 0,
            left: bytes,
        }
    }
}

impl tokio::io::AsyncRead for FollowingInput {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        use std::task::Poll;
        while self.at == self.chunk.len() {
            match self.chunks.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    return Poll::Ready(match self.left {
                        Some(left) if left > 0 => Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("the input was cut {left} bytes before its end"),
                        )),
                        _ => Ok(()),
                    })
                }
                Poll::Ready(Some(chunk)) => {
                    let more = chunk.len() as u64;
                    if let Some(left) = &mut self.left {
                        if more > *left {
                            return Poll::Ready(Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "more input than its length",
                            )));
                        }
                        *left -= more;
                    }
                    self.chunk = chunk;
                    self.at = 0;
                }
            }
        }
        let me = &mut *self;
        let n = buf.remaining().min(me.chunk.len() - me.at);
        buf.put_slice(&me.chunk[me.at..me.at + n]);
        me.at += n;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(wire: &[u8], max: u64) -> (io::Result<Vec<u8>>, Vec<CallFrame>) {
        let mut frames = Vec::new();
        let got = read_frames_then_answer(wire, max, &mut |f| {
            frames.push(f);
            true
        })
        .await;
        (got, frames)
    }

    #[tokio::test]
    async fn frames_come_one_by_one_then_the_answer() {
        let out = CallFrame::Stdout {
            data: b"\x1e\nhi\xff".to_vec(),
        };
        let started = CallFrame::ExecStarted {
            exec_id: "e1".into(),
            pid: 7,
        };
        let mut wire = started.to_line();
        wire.extend(out.to_line());
        wire.extend(b"{\n  \"code\": 0\n}\n");
        let (answer, frames) = read(&wire, 1 << 20).await;
        assert_eq!(answer.unwrap(), b"{\n  \"code\": 0\n}\n");
        assert_eq!(frames, [started, out]);
        // No frames at all: the answer as before.
        let (answer, frames) = read(b"{}", 10).await;
        assert_eq!((answer.unwrap(), frames.len()), (b"{}".to_vec(), 0));
        // The answer is held to its bound (plus one, to tell).
        let (answer, _) = read(&[b'x'; 100], 10).await;
        assert_eq!(answer.unwrap().len(), 11);
    }

    #[tokio::test]
    async fn however_much_a_guest_sends_at_once_each_frame_fits() {
        // An agent may send a whole MiB of output, a console line as long.
        let big: Vec<u8> = (0..(1 << 20) + 7).map(|i| (i % 251) as u8).collect();
        let mut wire = Vec::new();
        for frame in CallFrame::output(false, &big) {
            let line = frame.to_line();
            assert!(line.len() <= MAX_FRAME_BYTES, "{}", line.len());
            wire.extend(line);
        }
        let long = "é".repeat(1 << 19);
        let progress = CallFrame::start_progress(5, Some(long));
        assert!(progress.to_line().len() <= MAX_FRAME_BYTES);
        wire.extend(progress.to_line());
        wire.extend(b"{}");
        let (answer, frames) = read(&wire, 10).await;
        assert_eq!(answer.unwrap(), b"{}");
        let mut got = Vec::new();
        for frame in &frames {
            match frame {
                CallFrame::Stdout { data } => got.extend_from_slice(data),
                CallFrame::StartProgress { console, .. } => {
                    let console = console.as_deref().unwrap();
                    assert!(console.len() <= MAX_FRAME_CONSOLE && console.starts_with('é'));
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(got, big);
    }

    #[tokio::test]
    async fn a_frame_the_caller_refuses_ends_the_reading() {
        let mut wire = CallFrame::Copy { data: vec![1; 10] }.to_line();
        wire.extend(CallFrame::Copy { data: vec![2; 10] }.to_line());
        wire.extend(b"{}");
        let mut taken = 0;
        let got = read_frames_then_answer(&wire[..], 10, &mut |_| {
            taken += 1;
            taken < 2
        })
        .await;
        assert_eq!(got.unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(taken, 2);
    }

    #[tokio::test]
    async fn a_copy_leaves_as_bounded_frames_and_arrives_as_a_reader() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let big: Vec<u8> = (0..(MAX_FRAME_DATA * 2 + 5)).map(|i| i as u8).collect();
        let mut sent = Vec::new();
        let mut frames = |frame: CallFrame| {
            sent.push(frame);
            true
        };
        CopyFrames::new(&mut frames).write_all(&big).await.unwrap();
        assert_eq!(sent.len(), 3);
        let mut back = Vec::new();
        for frame in &sent {
            let CallFrame::Copy { data } = frame else {
                panic!("{frame:?}")
            };
            assert!(frame.to_line().len() <= MAX_FRAME_BYTES);
            back.extend_from_slice(data);
        }
        assert_eq!(back, big);
        // An empty write sends no frame (a caller ends a call on one).
        let mut none = Vec::new();
        let mut count = |frame: CallFrame| {
            none.push(frame);
            true
        };
        assert_eq!(CopyFrames::new(&mut count).write(&[]).await.unwrap(), 0);
        assert!(none.is_empty());
        // A caller that went away is a broken pipe.
        let mut gone = |_| false;
        let err = CopyFrames::new(&mut gone)
            .write_all(b"x")
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        // What follows a call, chunk by chunk, reads as one stream.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            for chunk in big.chunks(1000) {
                tx.send(chunk.to_vec()).await.unwrap();
            }
            tx.send(Vec::new()).await.unwrap();
        });
        let mut read = Vec::new();
        FollowingInput::new(rx, None)
            .read_to_end(&mut read)
            .await
            .unwrap();
        assert_eq!(read, back);
        // With its length: a cut before it, or more than it, is no end.
        for (sent, length, kind) in [
            (10, 10, None),
            (9, 10, Some(io::ErrorKind::UnexpectedEof)),
            (11, 10, Some(io::ErrorKind::InvalidData)),
        ] {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(vec![7; sent]).await.unwrap();
            drop(tx);
            let mut read = Vec::new();
            let got = FollowingInput::new(rx, Some(length))
                .read_to_end(&mut read)
                .await;
            assert_eq!(got.err().map(|e| e.kind()), kind, "{sent} of {length}");
        }
    }

    #[tokio::test]
    async fn input_frames_arrive_in_order_and_garbage_ends_them() {
        let typed: Vec<u8> = (0..MAX_FRAME_DATA + 3).map(|i| i as u8).collect();
        let mut wire: Vec<u8> = InputFrame::data(&typed).flat_map(|f| f.to_line()).collect();
        wire.extend(InputFrame::Resize { rows: 30, cols: 90 }.to_line());
        wire.extend(InputFrame::End {}.to_line());
        wire.extend(b"\x1e{\"input\":\"run\",\"argv\":[\"sh\"]}\n");
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        for chunk in wire.chunks(7000) {
            tx.send(chunk.to_vec()).await.unwrap();
        }
        drop(tx);
        let mut frames = InputFrames::new(FollowingInput::new(rx, None));
        let mut keys = Vec::new();
        while let Ok(Some(InputFrame::Data { data })) = frames.next().await {
            keys.extend(data);
            if keys.len() == typed.len() {
                break;
            }
        }
        assert_eq!(keys, typed);
        assert_eq!(
            frames.next().await.unwrap(),
            Some(InputFrame::Resize { rows: 30, cols: 90 })
        );
        assert_eq!(frames.next().await.unwrap(), Some(InputFrame::End {}));
        let err = frames.next().await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        // An input that simply ends is the terminal hanging up.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        drop(tx);
        let mut none = InputFrames::new(FollowingInput::new(rx, None));
        assert_eq!(none.next().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_hostile_frame_ends_the_reading() {
        let mut long = vec![FRAME_START];
        long.extend(std::iter::repeat_n(b'a', MAX_FRAME_BYTES + 10));
        long.push(b'\n');
        let mut unknown = vec![FRAME_START];
        unknown.extend(br#"{"frame":"run_on_host","argv":["sh"]}"#);
        unknown.push(b'\n');
        let mut extra = vec![FRAME_START];
        extra.extend(br#"{"frame":"stdout","data":"aGk=","more":1}"#);
        extra.push(b'\n');
        let cut = [FRAME_START, b'{'];
        for wire in [long, unknown, extra, cut.to_vec()] {
            let (got, frames) = read(&wire, 1 << 20).await;
            let err = got.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
            assert!(frames.is_empty());
        }
    }
}
