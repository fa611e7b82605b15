//! A process's stdio bridged to the FIFOs containerd gives: what the
//! process writes goes to the stdout and stderr FIFOs as it comes; what
//! the client writes to the stdin FIFO goes to the process until the
//! client closes it or containerd says `CloseIO`; a terminal's size
//! changes (`ResizePty`) go in beside the keystrokes.

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use workspace::guest::{PtySize, TerminalInput};
use workspace::ExecInput;

use crate::error::ShimError;

/// How long output still buffered may take to reach its FIFO once the
/// process has ended (containerd's own shim allows the same).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a waiting open of the stdin FIFO is let through, 10 ms
/// apart, when no client came.
const RELEASE_TRIES: u32 = 500;
/// Bytes read from the stdin FIFO at a time.
const STDIN_CHUNK: usize = 64 << 10;

/// The FIFO paths containerd gave (empty: none) and whether the process
/// has a terminal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stdio {
    /// Stdin FIFO.
    pub stdin: String,
    /// Stdout FIFO.
    pub stdout: String,
    /// Stderr FIFO.
    pub stderr: String,
    /// On a pseudo-terminal (stderr goes to stdout).
    pub terminal: bool,
}

/// One output FIFO, written by its own task.
#[derive(Debug)]
struct Output {
    chunks: Option<mpsc::UnboundedSender<Vec<u8>>>,
    writer: Option<JoinHandle<()>>,
}

impl Output {
    /// Opened read-write, so neither the open nor a write waits for a
    /// reader (a detached container's client may be gone), and a reader
    /// that leaves does not end the process with SIGPIPE.
    fn open(path: &str) -> Result<Self, ShimError> {
        if path.is_empty() {
            return Ok(Self {
                chunks: None,
                writer: None,
            });
        }
        let fifo = pipe::OpenOptions::new()
            .read_write(true)
            .open_sender(path)
            .map_err(|source| ShimError::Fifo {
                path: path.into(),
                source,
            })?;
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let writer = tokio::spawn(async move {
            let mut fifo = fifo;
            while let Some(chunk) = rx.recv().await {
                if fifo.write_all(&chunk).await.is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            chunks: Some(tx),
            writer: Some(writer),
        })
    }

    fn send(&self, bytes: Vec<u8>) {
        if let Some(tx) = &self.chunks {
            let _ = tx.send(bytes);
        }
    }

    async fn finish(&mut self) {
        self.chunks = None;
        if let Some(writer) = self.writer.take() {
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, writer).await;
        }
    }
}

/// Where a process's output goes.
#[derive(Debug)]
pub struct OutputFifos {
    stdout: Output,
    stderr: Output,
}

impl OutputFifos {
    /// Opens the stdout and stderr FIFOs of `stdio`.
    pub fn open(stdio: &Stdio) -> Result<Self, ShimError> {
        Ok(Self {
            stdout: Output::open(&stdio.stdout)?,
            stderr: Output::open(&stdio.stderr)?,
        })
    }

    /// A chunk of stdout.
    pub fn stdout(&self, bytes: Vec<u8>) {
        self.stdout.send(bytes);
    }

    /// A chunk of stderr.
    pub fn stderr(&self, bytes: Vec<u8>) {
        self.stderr.send(bytes);
    }

    /// Waits (bounded) for what is buffered to reach the FIFOs, then
    /// closes them: the client sees end of file.
    pub async fn finish(&mut self) {
        self.stdout.finish().await;
        self.stderr.finish().await;
    }
}

/// Closes a process's stdin and resizes its terminal while it runs.
#[derive(Debug, Clone, Default)]
pub struct InputControl {
    close: Arc<Notify>,
    resize: Arc<Mutex<Option<mpsc::Sender<TerminalInput>>>>,
}

impl InputControl {
    /// Ends the process's stdin (`CloseIO`); on a terminal only the FIFO
    /// is no longer read.
    pub fn close_stdin(&self) {
        self.close.notify_one();
    }

    /// Gives the terminal a new size; false when the process has none.
    pub async fn resize(&self, rows: u16, cols: u16) -> bool {
        let tx = self
            .resize
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match tx {
            Some(tx) => tx
                .send(TerminalInput::Resize(PtySize { rows, cols }))
                .await
                .is_ok(),
            None => false,
        }
    }

    /// The process ended: its terminal takes no more sizes.
    pub fn ended(&self) {
        *self
            .resize
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        self.close.notify_one();
    }
}

/// The process's input and what controls it.
pub fn input(stdio: &Stdio) -> (ExecInput, InputControl) {
    let control = InputControl::default();
    if stdio.terminal {
        let (tx, rx) = mpsc::channel::<TerminalInput>(16);
        *control
            .resize
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tx.clone());
        if !stdio.stdin.is_empty() {
            let close = control.close.clone();
            tokio::spawn(relay(stdio.stdin.clone().into(), close, move |bytes| {
                let tx = tx.clone();
                async move { tx.send(TerminalInput::Data(bytes)).await.is_ok() }
            }));
        }
        return (ExecInput::Terminal(rx), control);
    }
    if stdio.stdin.is_empty() {
        return (ExecInput::None, control);
    }
    let (tx, rx) = mpsc::channel::<Vec<u8>>(16);
    let close = control.close.clone();
    tokio::spawn(relay(stdio.stdin.clone().into(), close, move |bytes| {
        let tx = tx.clone();
        async move { tx.send(bytes).await.is_ok() }
    }));
    (ExecInput::Channel(rx), control)
}

/// Reads the stdin FIFO at `path` into `deliver` until the client closes
/// it, `close` is notified, or `deliver` says the process takes no more.
/// Dropping `deliver` at the end is what ends the process's stdin.
async fn relay<F, Fut>(path: PathBuf, close: Arc<Notify>, deliver: F)
where
    F: Fn(Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    // Opened for reading only, so end of file comes when the client closes
    // its end; such an open waits for a writer, hence a blocking thread.
    let mut opening = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || std::fs::File::open(path))
    };
    let file = tokio::select! {
        // An open that is done wins over a close that came with it: the
        // client may have written and asked to close in one breath.
        biased;
        opened = &mut opening => match opened {
            Ok(Ok(file)) => file,
            _ => return,
        },
        () = close.notified() => {
            // The thread may not have reached its open yet (a writer's
            // non-blocking open fails while no reader waits): let it
            // through until it is done, for at most RELEASE_TRIES.
            for _ in 0..RELEASE_TRIES {
                release_opener(&path);
                if opening.is_finished() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if opening.is_finished() {
                if let Ok(Ok(file)) = opening.await {
                    for chunk in drain(&file) {
                        if !deliver(chunk).await {
                            break;
                        }
                    }
                }
            }
            return;
        }
    };
    let Ok(mut fifo) = pipe::Receiver::from_file(file) else {
        return;
    };
    let mut buf = vec![0u8; STDIN_CHUNK];
    loop {
        tokio::select! {
            read = fifo.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if !deliver(buf[..n].to_vec()).await {
                        return;
                    }
                }
            },
            // What the client wrote before it asked to close is still
            // delivered (containerd's client writes, then calls CloseIO).
            () = close.notified() => {
                for chunk in drain(&fifo) {
                    if !deliver(chunk).await {
                        break;
                    }
                }
                return;
            }
        }
    }
}

/// Everything the FIFO `fifo` holds now, read without waiting for more
/// (straight from the descriptor: the runtime may not have seen it
/// become readable yet).
fn drain(fifo: &impl AsRawFd) -> Vec<Vec<u8>> {
    let fd = fifo.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on a descriptor the caller holds open.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
    let mut chunks = Vec::new();
    let mut buf = vec![0u8; STDIN_CHUNK];
    loop {
        // SAFETY: reads at most buf.len() bytes into buf, which outlives
        // the call; fd is open for the call's duration.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return chunks;
        }
        chunks.push(buf[..n as usize].to_vec());
    }
}

/// Lets a blocked open for reading of the FIFO at `path` finish (a writer
/// that opens and closes at once), so its thread does not wait forever
/// for a client that never came.
fn release_opener(path: &std::path::Path) {
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkfifo(path: &std::path::Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    /// A stdin FIFO in a fresh directory, and the process's side of it.
    fn stdin_fifo(test: &str) -> (PathBuf, PathBuf, mpsc::Receiver<Vec<u8>>, InputControl) {
        let d = dir(test);
        let path = d.join("stdin");
        mkfifo(&path);
        let (input, control) = input(&Stdio {
            stdin: path.display().to_string(),
            ..Stdio::default()
        });
        let ExecInput::Channel(rx) = input else {
            panic!("not a channel");
        };
        (d, path, rx, control)
    }

    /// Everything the process's stdin gets, to its end.
    async fn received(rx: &mut mpsc::Receiver<Vec<u8>>) -> Vec<u8> {
        let mut got = Vec::new();
        while let Some(chunk) = rx.recv().await {
            got.extend(chunk);
        }
        got
    }

    fn dir(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ma-shim-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[tokio::test]
    async fn output_reaches_the_fifo_and_ends_with_end_of_file() {
        let d = dir("out");
        let path = d.join("stdout");
        mkfifo(&path);
        // The client's end is open before the shim's, as containerd's is.
        let mut client = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .unwrap();
        // SAFETY: F_SETFL on an fd this test owns.
        let rc = unsafe { libc::fcntl(client.as_raw_fd(), libc::F_SETFL, 0) };
        assert_eq!(rc, 0);
        let reader = tokio::task::spawn_blocking(move || {
            let mut got = Vec::new();
            std::io::Read::read_to_end(&mut client, &mut got).unwrap();
            got
        });
        let mut outputs = OutputFifos::open(&Stdio {
            stdout: path.display().to_string(),
            ..Stdio::default()
        })
        .unwrap();
        outputs.stdout(b"hello ".to_vec());
        outputs.stderr(b"dropped: no stderr FIFO".to_vec());
        outputs.stdout(b"world".to_vec());
        outputs.finish().await;
        // The read-write open is the shim's own writer end gone; the
        // reader's end of file follows the last writer.
        assert_eq!(reader.await.unwrap(), b"hello world");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn stdin_is_relayed_until_the_client_closes_it() {
        let (d, path, mut rx, _control) = stdin_fifo("in");
        let writer = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
                f.write_all(b"line one\n").unwrap();
            })
        };
        writer.await.unwrap();
        let got = received(&mut rx).await;
        assert_eq!(got, b"line one\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn what_was_written_before_close_io_is_delivered() {
        let (d, path, mut rx, control) = stdin_fifo("drain");
        // The client keeps its end open, writes, and asks to close at once.
        let mut client = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || {
                std::fs::OpenOptions::new().write(true).open(path).unwrap()
            })
            .await
            .unwrap()
        };
        std::io::Write::write_all(&mut client, b"all of it\n").unwrap();
        control.close_stdin();
        let got = received(&mut rx).await;
        assert_eq!(got, b"all of it\n");
        drop(client);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn close_io_ends_stdin_even_before_a_client_opened_it() {
        let (d, _path, mut rx, control) = stdin_fifo("close");
        control.close_stdin();
        let ended = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
        assert_eq!(ended.unwrap(), None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn a_terminal_takes_sizes_until_its_process_ends() {
        let (input, control) = input(&Stdio {
            terminal: true,
            ..Stdio::default()
        });
        let ExecInput::Terminal(mut rx) = input else {
            panic!("not a terminal");
        };
        assert!(control.resize(40, 120).await);
        assert_eq!(
            rx.recv().await,
            Some(TerminalInput::Resize(PtySize {
                rows: 40,
                cols: 120
            }))
        );
        control.ended();
        assert!(!control.resize(1, 1).await);
    }
}
