//! A Jupyter kernel client over three streams (shell, iopub, control):
//! wait for the kernel, run code and gather what it printed, returned,
//! displayed and raised; interrupt; shut down. Every size the kernel
//! sends is bounded (`CodeRunLimits`); a run past its deadline or
//! cancelled is interrupted and read to its end, so the session stays in
//! step.

use std::future::Future;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};

use super::outputs::{CodeRunLimits, Gathered};
use super::wire::{Message, Signer, WireError};
use super::zmtp::{SocketType, Zmtp, ZmtpError};
use super::CodeRun;

/// How long a kernel may take to answer its first `kernel_info_request`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an interrupted run may take to end.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(10);
/// How long a kernel_info request is given before it is asked again
/// (its iopub subscription may not have reached the kernel yet).
const READY_RETRY: Duration = Duration::from_millis(500);
/// The longest wait between two of them.
const READY_RETRY_MAX: Duration = Duration::from_secs(8);

/// Why a kernel call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JupyterError {
    /// A channel's connection failed.
    #[error("the kernel's {channel} channel failed")]
    Channel {
        /// shell, iopub or control.
        channel: &'static str,
        /// What failed.
        #[source]
        source: ZmtpError,
    },
    /// The kernel sent what is not a message of this session.
    #[error("the kernel's {channel} channel sent a bad message")]
    Message {
        /// shell, iopub or control.
        channel: &'static str,
        /// What was wrong.
        #[source]
        source: WireError,
    },
    /// The kernel did not answer in time.
    #[error("the kernel did not {what} within {}s", .after.as_secs())]
    Unresponsive {
        /// What it did not do.
        what: &'static str,
        /// The time given.
        after: Duration,
    },
}

/// A connected kernel.
pub struct JupyterClient<S> {
    shell: Zmtp<S>,
    iopub: Zmtp<S>,
    control: Zmtp<S>,
    signer: Signer,
    session: String,
    sent: u64,
}

impl<S> std::fmt::Debug for JupyterClient<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JupyterClient")
            .field("session", &self.session)
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

/// Whether a run ended by itself or was stopped.
enum Stop {
    None,
    Cancelled,
    TimedOut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> JupyterClient<S> {
    /// Handshakes on the three streams with `key` (the connection file's),
    /// then waits up to `ready` for the kernel to answer on shell and
    /// publish on iopub (so no output of the first run is missed).
    pub async fn connect(
        shell: S,
        iopub: S,
        control: S,
        key: &[u8],
        ready: Duration,
    ) -> Result<Self, JupyterError> {
        let channel = |channel| move |source| JupyterError::Channel { channel, source };
        let session = base::host::dirfd::random_hex();
        // One deadline for the handshakes and the first answer: a port
        // that accepts and says nothing holds no one longer.
        let connected = async {
            let mut client = Self {
                shell: Zmtp::handshake(shell, SocketType::Dealer)
                    .await
                    .map_err(channel("shell"))?,
                iopub: Zmtp::handshake(iopub, SocketType::Sub)
                    .await
                    .map_err(channel("iopub"))?,
                control: Zmtp::handshake(control, SocketType::Dealer)
                    .await
                    .map_err(channel("control"))?,
                signer: Signer::new(key, session.clone()),
                session: session.clone(),
                sent: 0,
            };
            client.wait_ready().await?;
            Ok(client)
        };
        tokio::time::timeout(ready, connected)
            .await
            .map_err(|_| JupyterError::Unresponsive {
                what: "answer",
                after: ready,
            })?
    }

    /// Whether `parent` is one of this client's requests.
    fn ours(session: &str, parent: Option<&str>) -> bool {
        parent.is_some_and(|p| {
            p.strip_prefix(session)
                .is_some_and(|rest| rest.starts_with('-'))
        })
    }

    fn next_id(&mut self) -> String {
        self.sent += 1;
        format!("{}-{}", self.session, self.sent)
    }

    async fn send(
        &mut self,
        channel: &'static str,
        msg_type: &str,
        content: Value,
    ) -> Result<String, JupyterError> {
        let id = self.next_id();
        let frames = self.signer.request(msg_type, &id, &content);
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let zmtp = if channel == "control" {
            &mut self.control
        } else {
            &mut self.shell
        };
        zmtp.send(&refs)
            .await
            .map_err(|source| JupyterError::Channel { channel, source })?;
        Ok(id)
    }

    /// The next message on `zmtp` whose parent is `wanted` (others are
    /// passed over with their content unparsed).
    async fn recv(
        zmtp: &mut Zmtp<S>,
        signer: &Signer,
        channel: &'static str,
        wanted: impl Fn(Option<&str>) -> bool,
    ) -> Result<Message, JupyterError> {
        loop {
            let frames = zmtp
                .recv()
                .await
                .map_err(|source| JupyterError::Channel { channel, source })?;
            let read = signer
                .read(&frames, &wanted)
                .map_err(|source| JupyterError::Message { channel, source })?;
            if let Some(message) = read {
                return Ok(message);
            }
        }
    }

    /// kernel_info until one is seen on iopub too (its `status`): the
    /// answer to any of them, however slow the kernel.
    async fn wait_ready(&mut self) -> Result<(), JupyterError> {
        // Asked again sooner at first (a subscription that had not reached
        // the kernel), then less often: a kernel still starting answers
        // every request it was sent once it is up.
        let mut retry = READY_RETRY;
        loop {
            self.send("shell", "kernel_info_request", json!({})).await?;
            let session = self.session.clone();
            let ours = |p: Option<&str>| Self::ours(&session, p);
            let seen = tokio::time::timeout(
                retry,
                Self::recv(&mut self.iopub, &self.signer, "iopub", ours),
            )
            .await;
            if let Ok(message) = seen {
                message?;
                return Ok(());
            }
            retry = (retry * 2).min(READY_RETRY_MAX);
        }
    }

    /// Readies a connection kept idle since its last run for the next:
    /// when anything was published or answered meanwhile (another client's
    /// runs, a thread still printing), a `kernel_info` round trip within
    /// `ready` reads the backlog to this client's own status, so the
    /// kernel's queue for it has room for the run's messages; an ended
    /// stream or no answer in time is an error (connect anew: no code was
    /// sent).
    pub(crate) async fn resume_kept(&mut self, ready: Duration) -> Result<(), JupyterError> {
        let channel = |channel| move |source| JupyterError::Channel { channel, source };
        let quiet = self.iopub.quiet().map_err(channel("iopub"))?
            & self.shell.quiet().map_err(channel("shell"))?
            & self.control.quiet().map_err(channel("control"))?;
        if quiet {
            return Ok(());
        }
        tokio::time::timeout(ready, self.wait_ready())
            .await
            .map_err(|_| JupyterError::Unresponsive {
                what: "answer",
                after: ready,
            })?
    }

    /// Gives back the buffers' spare room before the connection is kept.
    pub(crate) fn compact(&mut self) {
        for channel in [&mut self.shell, &mut self.iopub, &mut self.control] {
            channel.compact();
        }
    }

    /// Runs `code`; `on_stream` hears each piece of stdout/stderr as it
    /// comes (`"stdout"`/`"stderr"`, text). A run past `timeout`, or whose
    /// `cancelled` completes, is interrupted (KeyboardInterrupt in Python)
    /// and read to its end: its `error` says so.
    pub async fn execute(
        &mut self,
        code: &str,
        timeout: Duration,
        limits: CodeRunLimits,
        cancelled: impl Future<Output = ()>,
        on_stream: impl FnMut(&str, &str),
    ) -> Result<CodeRun, JupyterError> {
        self.run_code(code, false, timeout, limits, cancelled, on_stream)
            .await
    }

    /// Runs `code` silently: no history, no count, no result shown (what
    /// the library runs in a kernel besides its caller's code).
    pub(crate) async fn execute_silently(
        &mut self,
        code: &str,
        timeout: Duration,
    ) -> Result<CodeRun, JupyterError> {
        let never = std::future::pending();
        self.run_code(
            code,
            true,
            timeout,
            CodeRunLimits::default(),
            never,
            |_, _| {},
        )
        .await
    }

    async fn run_code(
        &mut self,
        code: &str,
        silent: bool,
        timeout: Duration,
        limits: CodeRunLimits,
        cancelled: impl Future<Output = ()>,
        mut on_stream: impl FnMut(&str, &str),
    ) -> Result<CodeRun, JupyterError> {
        let content = json!({
            "code": code,
            "silent": silent,
            "store_history": !silent,
            "user_expressions": {},
            "allow_stdin": false,
            // One run at a time: nothing queued to abort (and a run sent
            // just after an error would be aborted).
            "stop_on_error": false,
        });
        // A kernel that does not read its shell holds the run no longer
        // than its timeout.
        let id = tokio::time::timeout(timeout, self.send("shell", "execute_request", content))
            .await
            .map_err(|_| JupyterError::Unresponsive {
                what: "take the code",
                after: timeout,
            })??;
        let is_run = |p: Option<&str>| p == Some(id.as_str());
        let mut run = Gathered::new(limits);
        let (mut idle, mut replied) = (false, false);
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline, cancelled);
        let mut stop = Stop::None;
        let mut grace: Option<tokio::time::Instant> = None;
        while !(idle && replied) {
            let grace_over = async move {
                match grace {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            // The deadlines first: a kernel that floods its channels must
            // not keep them from being seen.
            tokio::select! {
                biased;
                () = grace_over => {
                    return Err(JupyterError::Unresponsive { what: "stop after an interrupt", after: INTERRUPT_GRACE });
                }
                () = &mut deadline, if matches!(stop, Stop::None) => {
                    stop = Stop::TimedOut;
                    grace = Some(self.interrupt_now().await?);
                }
                () = &mut cancelled, if matches!(stop, Stop::None) => {
                    stop = Stop::Cancelled;
                    grace = Some(self.interrupt_now().await?);
                }
                message = Self::recv(&mut self.iopub, &self.signer, "iopub", is_run) => {
                    let message = message?;
                    if message.msg_type == "status" && message.content["execution_state"] == "idle" {
                        idle = true;
                    }
                    run.take(&message, &mut on_stream);
                }
                message = Self::recv(&mut self.shell, &self.signer, "shell", is_run) => {
                    let message = message?;
                    if message.msg_type == "execute_reply" {
                        replied = true;
                        run.reply(&message.content);
                    }
                }
            }
        }
        let mut done = run.finish();
        match stop {
            Stop::None => {}
            Stop::Cancelled => done.stopped = Some("cancelled".into()),
            Stop::TimedOut => {
                done.stopped = Some(format!("timed out after {}s", timeout.as_secs()))
            }
        }
        Ok(done)
    }

    /// Sends `interrupt_request` on control (the kernel signals itself);
    /// the deadline by which the run must end.
    async fn interrupt_now(&mut self) -> Result<tokio::time::Instant, JupyterError> {
        let by = tokio::time::Instant::now() + INTERRUPT_GRACE;
        let sent =
            tokio::time::timeout_at(by, self.send("control", "interrupt_request", json!({})));
        sent.await.map_err(|_| JupyterError::Unresponsive {
            what: "take an interrupt",
            after: INTERRUPT_GRACE,
        })??;
        Ok(by)
    }

    /// Asks the kernel to end (or restart in place), and waits for its
    /// answer on control.
    pub async fn shutdown(&mut self, restart: bool) -> Result<(), JupyterError> {
        let id = self
            .send("control", "shutdown_request", json!({"restart": restart}))
            .await?;
        let wait = async {
            let is_it = |p: Option<&str>| p == Some(id.as_str());
            Self::recv(&mut self.control, &self.signer, "control", is_it)
                .await
                .map(drop)
        };
        tokio::time::timeout(INTERRUPT_GRACE, wait)
            .await
            .map_err(|_| JupyterError::Unresponsive {
                what: "shut down",
                after: INTERRUPT_GRACE,
            })?
    }
}

/// Sends an `interrupt_request` on a control connection of its own and
/// waits (up to [`INTERRUPT_GRACE`]) for its answer: for a run whose
/// client has gone, whatever state that client left its channels in.
pub async fn send_interrupt<S: AsyncRead + AsyncWrite + Unpin>(
    control: S,
    key: &[u8],
) -> Result<(), JupyterError> {
    let channel = |source| JupyterError::Channel {
        channel: "control",
        source,
    };
    // All of it within the grace: a silent listener holds no task longer.
    let interrupted = async {
        let mut control = Zmtp::handshake(control, SocketType::Dealer)
            .await
            .map_err(channel)?;
        let session = base::host::dirfd::random_hex();
        let signer = Signer::new(key, session.clone());
        let id = format!("{session}-interrupt");
        let frames = signer.request("interrupt_request", &id, &json!({}));
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        control.send(&refs).await.map_err(channel)?;
        let is_it = |p: Option<&str>| p == Some(id.as_str());
        JupyterClient::recv(&mut control, &signer, "control", is_it)
            .await
            .map(drop)
    };
    tokio::time::timeout(INTERRUPT_GRACE, interrupted)
        .await
        .map_err(|_| JupyterError::Unresponsive {
            what: "answer an interrupt",
            after: INTERRUPT_GRACE,
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn send_frames<S: AsyncRead + AsyncWrite + Unpin>(z: &mut Zmtp<S>, frames: &[Vec<u8>]) {
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let _ = z.send(&refs).await;
    }

    /// A fake kernel on three duplex streams: it answers kernel_info on
    /// iopub, then floods iopub with messages of another request forever
    /// and never answers the run nor its interrupt.
    #[tokio::test]
    async fn a_kernel_flooding_other_parents_still_times_out() {
        use super::super::zmtp::peer_for_tests;
        let key = b"k".to_vec();
        let (shell, shell_peer) = tokio::io::duplex(1 << 20);
        let (iopub, iopub_peer) = tokio::io::duplex(1 << 20);
        let (control, control_peer) = tokio::io::duplex(1 << 20);
        let peer_key = key.clone();
        let kernel = tokio::spawn(async move {
            let signer = Signer::new(&peer_key, "kernel".into());
            let mut shell = peer_for_tests(shell_peer, "ROUTER").await;
            let mut iopub = peer_for_tests(iopub_peer, "PUB").await;
            let _control = peer_for_tests(control_peer, "ROUTER").await;
            let ask = signer.read(&shell.recv().await.unwrap(), |_| true);
            let ask = ask.unwrap().unwrap();
            let _ = iopub.recv().await; // the subscription
            let status = json!({"execution_state": "idle"});
            let ready = signer.reply_for_tests("status", &ask.msg_id, &status);
            send_frames(&mut iopub, &ready).await;
            let _run = shell.recv().await.unwrap();
            let other = signer.reply_for_tests("status", "someone-else", &status);
            loop {
                send_frames(&mut iopub, &other).await;
            }
        });
        let mut client =
            JupyterClient::connect(shell, iopub, control, &key, Duration::from_secs(10))
                .await
                .unwrap();
        let began = std::time::Instant::now();
        let ran = client
            .execute(
                "x",
                Duration::from_secs(1),
                CodeRunLimits::default(),
                std::future::pending(),
                |_, _| {},
            )
            .await;
        assert!(
            matches!(ran, Err(JupyterError::Unresponsive { .. })),
            "{ran:?}"
        );
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "{:?}",
            began.elapsed()
        );
        kernel.abort();
    }
}
