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

/// How long a kernel may take to answer its first `kernel_info_request`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an interrupted run may take to end.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(10);
/// How long a kernel_info request is given before it is asked again
/// (its iopub subscription may not have reached the kernel yet).
const READY_RETRY: Duration = Duration::from_millis(500);

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
            session,
            sent: 0,
        };
        let waited = tokio::time::timeout(ready, client.wait_ready()).await;
        waited.map_err(|_| JupyterError::Unresponsive {
            what: "answer",
            after: ready,
        })??;
        Ok(client)
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

    async fn recv(
        zmtp: &mut Zmtp<S>,
        signer: &Signer,
        channel: &'static str,
    ) -> Result<Message, JupyterError> {
        let frames = zmtp
            .recv()
            .await
            .map_err(|source| JupyterError::Channel { channel, source })?;
        signer
            .read(&frames)
            .map_err(|source| JupyterError::Message { channel, source })
    }

    /// kernel_info until one is seen on iopub too (its `status`).
    async fn wait_ready(&mut self) -> Result<(), JupyterError> {
        loop {
            let id = self.send("shell", "kernel_info_request", json!({})).await?;
            let until = tokio::time::Instant::now() + READY_RETRY;
            loop {
                let got = tokio::time::timeout_at(
                    until,
                    Self::recv(&mut self.iopub, &self.signer, "iopub"),
                )
                .await;
                let Ok(message) = got else {
                    break;
                };
                if message?.parent_id.as_deref() == Some(id.as_str()) {
                    return Ok(());
                }
            }
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
        mut on_stream: impl FnMut(&str, &str),
    ) -> Result<CodeRun, JupyterError> {
        let content = json!({
            "code": code,
            "silent": false,
            "store_history": true,
            "user_expressions": {},
            "allow_stdin": false,
            // One run at a time: nothing queued to abort (and a run sent
            // just after an error would be aborted).
            "stop_on_error": false,
        });
        let id = self.send("shell", "execute_request", content).await?;
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
            tokio::select! {
                biased;
                message = Self::recv(&mut self.iopub, &self.signer, "iopub") => {
                    let message = message?;
                    if message.parent_id.as_deref() != Some(id.as_str()) {
                        continue;
                    }
                    if message.msg_type == "status" && message.content["execution_state"] == "idle" {
                        idle = true;
                    }
                    run.take(&message, &mut on_stream);
                }
                message = Self::recv(&mut self.shell, &self.signer, "shell") => {
                    let message = message?;
                    if message.parent_id.as_deref() == Some(id.as_str()) && message.msg_type == "execute_reply" {
                        replied = true;
                        run.reply(&message.content);
                    }
                }
                () = &mut deadline, if matches!(stop, Stop::None) => {
                    stop = Stop::TimedOut;
                    grace = Some(self.interrupt_now().await?);
                }
                () = &mut cancelled, if matches!(stop, Stop::None) => {
                    stop = Stop::Cancelled;
                    grace = Some(self.interrupt_now().await?);
                }
                () = grace_over => {
                    return Err(JupyterError::Unresponsive { what: "stop after an interrupt", after: INTERRUPT_GRACE });
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
        self.send("control", "interrupt_request", json!({})).await?;
        Ok(tokio::time::Instant::now() + INTERRUPT_GRACE)
    }

    /// Asks the kernel to end (or restart in place), and waits for its
    /// answer on control.
    pub async fn shutdown(&mut self, restart: bool) -> Result<(), JupyterError> {
        let id = self
            .send("control", "shutdown_request", json!({"restart": restart}))
            .await?;
        let wait = async {
            loop {
                let message = Self::recv(&mut self.control, &self.signer, "control").await?;
                if message.parent_id.as_deref() == Some(id.as_str()) {
                    return Ok(());
                }
            }
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
    let mut control = Zmtp::handshake(control, SocketType::Dealer)
        .await
        .map_err(channel)?;
    let session = base::host::dirfd::random_hex();
    let signer = Signer::new(key, session.clone());
    let id = format!("{session}-interrupt");
    let frames = signer.request("interrupt_request", &id, &json!({}));
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    control.send(&refs).await.map_err(channel)?;
    let answered = async {
        loop {
            let message = JupyterClient::recv(&mut control, &signer, "control").await?;
            if message.parent_id.as_deref() == Some(id.as_str()) {
                return Ok(());
            }
        }
    };
    tokio::time::timeout(INTERRUPT_GRACE, answered)
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
                self.run.result = c["data"]["text/plain"].as_str().map(str::to_owned);
                self.outputs(&c["data"], true);
            }
            "display_data" => self.outputs(&c["data"], false),
            "error" => {
                let text = |v: &Value| strip_ansi(v.as_str().unwrap_or_default());
                self.run.error = Some(CodeException {
                    name: text(&c["ename"]),
                    value: text(&c["evalue"]),
                    traceback: c["traceback"]
                        .as_array()
                        .map(|lines| lines.iter().take(200).map(text).collect())
                        .unwrap_or_default(),
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
        let run = g.finish();
        assert_eq!(run.outputs.len(), 1);
        assert_eq!(run.outputs[0].data, "alone");
        assert_eq!(run.error.unwrap().traceback.len(), 0);
    }

    #[test]
    fn ansi_sequences_are_stripped() {
        assert_eq!(strip_ansi("\u{1b}[0;31mA\u{1b}[0m b\u{1b}"), "A b");
        assert_eq!(strip_ansi("\u{1b}[38;5;12mx"), "x");
    }
}
