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

use super::wire::{Message, Signer, WireError};
use super::zmtp::{SocketType, Zmtp, ZmtpError};
use super::{CodeException, CodeOutput, CodeRun};

/// The image types a display carries in base64.
const BASE64_IMAGES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];
/// How long a kernel may take to answer its first `kernel_info_request`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an interrupted run may take to end.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(10);
/// Bytes of a result's text kept.
const MAX_RESULT_BYTES: usize = 1024 * 1024;
/// Bytes of an exception's name, and of its value, kept.
const MAX_NAME_BYTES: usize = 64 * 1024;
/// Bytes of a traceback kept, all lines together.
const MAX_TRACEBACK_BYTES: usize = 256 * 1024;
/// How long a kernel_info request is given before it is asked again
/// (its iopub subscription may not have reached the kernel yet).
const READY_RETRY: Duration = Duration::from_millis(500);
/// The longest wait between two of them.
const READY_RETRY_MAX: Duration = Duration::from_secs(8);

/// Bounds on what one run keeps.
#[derive(Debug, Clone, Copy)]
pub struct CodeRunLimits {
    /// Bytes of stdout, and of stderr, kept (the first ones).
    pub stream_bytes: usize,
    /// Bytes of rich outputs kept, all together.
    pub output_bytes: usize,
    /// Rich outputs kept.
    pub outputs: usize,
}

impl Default for CodeRunLimits {
    fn default() -> Self {
        Self {
            stream_bytes: 1024 * 1024,
            output_bytes: 16 * 1024 * 1024,
            outputs: 32,
        }
    }
}

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

/// What a run has produced so far, within its limits.
struct Gathered {
    limits: CodeRunLimits,
    run: CodeRun,
    output_bytes: usize,
}

impl Gathered {
    fn new(limits: CodeRunLimits) -> Self {
        Self {
            limits,
            run: CodeRun::default(),
            output_bytes: 0,
        }
    }

    fn take(&mut self, message: &Message, on_stream: &mut impl FnMut(&str, &str)) {
        let c = &message.content;
        match message.msg_type.as_str() {
            "stream" => {
                let text = c["text"].as_str().unwrap_or_default();
                let name = if c["name"] == "stderr" {
                    "stderr"
                } else {
                    "stdout"
                };
                on_stream(name, text);
                let kept = if name == "stderr" {
                    &mut self.run.stderr
                } else {
                    &mut self.run.stdout
                };
                if !push_bounded(kept, text, self.limits.stream_bytes) {
                    self.run.truncated = true;
                }
            }
            "execute_result" => {
                self.run.result = c["data"]["text/plain"].as_str().map(|text| {
                    let mut kept = String::new();
                    if !push_bounded(&mut kept, text, MAX_RESULT_BYTES) {
                        self.run.truncated = true;
                    }
                    kept
                });
                self.outputs(&c["data"], true);
            }
            "display_data" => self.outputs(&c["data"], false),
            "error" => {
                // The traceback's lines share one bound; a name and value
                // have their own.
                let mut left = MAX_TRACEBACK_BYTES;
                let mut cut = false;
                let mut text = |v: &Value, bound: usize| {
                    let mut kept = String::new();
                    let whole = strip_ansi(v.as_str().unwrap_or_default());
                    cut |= !push_bounded(&mut kept, &whole, bound);
                    kept
                };
                let name = text(&c["ename"], MAX_NAME_BYTES);
                let value = text(&c["evalue"], MAX_NAME_BYTES);
                let mut traceback = Vec::new();
                for line in c["traceback"].as_array().into_iter().flatten().take(200) {
                    let kept = text(line, left);
                    left -= kept.len();
                    traceback.push(kept);
                    if left == 0 {
                        break;
                    }
                }
                self.run.truncated |= cut;
                self.run.error = Some(CodeException {
                    name,
                    value,
                    traceback,
                });
            }
            "clear_output" => {
                self.run.stdout.clear();
                self.run.stderr.clear();
                self.run.outputs.clear();
                self.output_bytes = 0;
            }
            _ => {}
        }
    }

    /// Each representation of a display but plain text, which is kept
    /// only when it is all there is (the result's is `result`).
    fn outputs(&mut self, data: &Value, is_result: bool) {
        let Some(bundle) = data.as_object() else {
            return;
        };
        let rich = bundle.keys().any(|m| m != "text/plain");
        for (mime, value) in bundle {
            if mime == "text/plain" && (rich || is_result) {
                continue;
            }
            let data = match value {
                // Base64 as IPython writes it ends in a newline (and may be
                // wrapped): the data alone, for clients that decode it.
                Value::String(s) if BASE64_IMAGES.contains(&mime.as_str()) => {
                    s.chars().filter(|c| !c.is_ascii_whitespace()).collect()
                }
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if self.run.outputs.len() >= self.limits.outputs
                || self.output_bytes + data.len() > self.limits.output_bytes
            {
                self.run.truncated = true;
                continue;
            }
            self.output_bytes += data.len();
            self.run.outputs.push(CodeOutput {
                mime: mime.chars().take(128).collect(),
                data,
            });
        }
    }

    fn reply(&mut self, content: &Value) {
        self.run.execution_count = content["execution_count"].as_u64();
        if content["status"] == "aborted" {
            self.run.stopped = Some("aborted by the kernel".into());
        }
    }

    fn finish(self) -> CodeRun {
        self.run
    }
}

/// Appends what fits of `text` within `limit` bytes (on a character
/// boundary); whether all of it did.
fn push_bounded(kept: &mut String, text: &str, limit: usize) -> bool {
    let room = limit.saturating_sub(kept.len());
    if text.len() <= room {
        kept.push_str(text);
        return true;
    }
    let mut end = room;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    kept.push_str(&text[..end]);
    false
}

/// `text` without ANSI escape sequences (tracebacks come colored).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // Parameters and intermediates, then one final byte.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(msg_type: &str, content: Value) -> Message {
        Message {
            msg_type: msg_type.into(),
            msg_id: "m".into(),
            parent_id: Some("p".into()),
            content,
        }
    }

    #[test]
    fn outputs_are_gathered_within_their_limits() {
        let limits = CodeRunLimits {
            stream_bytes: 8,
            output_bytes: 10,
            outputs: 2,
        };
        let mut g = Gathered::new(limits);
        let mut heard = Vec::new();
        let mut hear = |n: &str, t: &str| heard.push(format!("{n}:{t}"));
        g.take(
            &message("stream", json!({"name": "stdout", "text": "héllo wörld"})),
            &mut hear,
        );
        g.take(
            &message("stream", json!({"name": "stderr", "text": "warn"})),
            &mut hear,
        );
        g.take(
            &message(
                "execute_result",
                json!({"data": {"text/plain": "42", "text/html": "<b>42</b>"}}),
            ),
            &mut hear,
        );
        g.take(
            &message(
                "display_data",
                json!({"data": {"image/png": "iVBORw0KGgo="}}),
            ),
            &mut hear,
        );
        g.take(
            &message("error", json!({"ename": "\u{1b}[31mValueError\u{1b}[0m", "evalue": "bad", "traceback": ["\u{1b}[1;31mline\u{1b}[0m"]})),
            &mut hear,
        );
        let run = g.finish();
        assert_eq!(heard, ["stdout:héllo wörld", "stderr:warn"]);
        assert_eq!(run.stdout, "héllo w", "cut on a character boundary");
        assert_eq!(run.stderr, "warn");
        assert_eq!(run.result.as_deref(), Some("42"));
        assert_eq!(run.outputs.len(), 1, "{:?}", run.outputs);
        assert_eq!(run.outputs[0].mime, "text/html");
        assert!(run.truncated);
        let error = run.error.unwrap();
        assert_eq!(
            (error.name.as_str(), error.traceback[0].as_str()),
            ("ValueError", "line")
        );
    }

    #[test]
    fn plain_text_displays_are_kept_only_alone_and_garbage_is_passed_over() {
        let mut g = Gathered::new(CodeRunLimits::default());
        let mut hear = |_: &str, _: &str| {};
        g.take(
            &message("display_data", json!({"data": {"text/plain": "alone"}})),
            &mut hear,
        );
        g.take(
            &message("display_data", json!({"data": "not a bundle"})),
            &mut hear,
        );
        g.take(&message("stream", json!({"text": 7})), &mut hear);
        g.take(
            &message("error", json!({"traceback": "not a list"})),
            &mut hear,
        );
        g.take(&message("no_such_type", json!(null)), &mut hear);
        // IPython's base64 ends in a newline: the image is its data alone.
        g.take(
            &message(
                "display_data",
                json!({"data": {"image/png": "iVBORw0K\nGgo=\n", "text/plain": "<Figure>"}}),
            ),
            &mut hear,
        );
        let run = g.finish();
        assert_eq!(run.outputs.len(), 2);
        assert_eq!(run.outputs[0].data, "alone");
        assert_eq!(run.outputs[1].data, "iVBORw0KGgo=");
        assert_eq!(run.error.unwrap().traceback.len(), 0);
    }

    #[test]
    fn a_huge_result_or_traceback_is_cut_and_marked() {
        let mut g = Gathered::new(CodeRunLimits::default());
        let mut hear = |_: &str, _: &str| {};
        let huge = "r".repeat(MAX_RESULT_BYTES + 10);
        g.take(
            &message("execute_result", json!({"data": {"text/plain": huge}})),
            &mut hear,
        );
        let line = "t".repeat(100 * 1024);
        g.take(
            &message(
                "error",
                json!({"ename": "n".repeat(MAX_NAME_BYTES * 2), "evalue": "v",
                "traceback": [line, line, line, line]}),
            ),
            &mut hear,
        );
        let run = g.finish();
        assert_eq!(run.result.unwrap().len(), MAX_RESULT_BYTES);
        let error = run.error.unwrap();
        assert_eq!(error.name.len(), MAX_NAME_BYTES);
        let kept: usize = error.traceback.iter().map(String::len).sum();
        assert_eq!(kept, MAX_TRACEBACK_BYTES);
        assert!(run.truncated);
    }

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

    #[test]
    fn ansi_sequences_are_stripped() {
        assert_eq!(strip_ansi("\u{1b}[0;31mA\u{1b}[0m b\u{1b}"), "A b");
        assert_eq!(strip_ansi("\u{1b}[38;5;12mx"), "x");
    }
}
