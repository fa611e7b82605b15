//! A workspace placed on a server, reached through the library's own
//! calls: this host sends one [`WorkspaceCall`] as JSON on the stdin of
//! the server's hidden `microagent --json --server local workspace-call`,
//! which makes the same call on its own library and prints the answer. So
//! both hosts apply one set of checks, and a handle's call works the same
//! wherever its workspace lives. Who may use the workspace is decided on
//! this host before anything is sent (the server runs what it is sent as
//! its host, and knows no agents); what the server answers is data, read
//! into the call's own answer type only.

use std::net::IpAddr;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::registry::ServerRegistry;
use super::remote::{run_remote_streaming, typed_answer_of, RunStreams, DEFAULT_DEADLINE};
use super::spec::{ServerSpec, LOCAL_SERVER};
use super::ServerError;
use base::store::ports::PortMapping;

/// Slack over a call's own wait for the SSH round trip.
const SLACK: Duration = Duration::from_secs(30);
/// Most bytes of one call sent to a server (a file write's data, base64).
pub const MAX_CALL_BYTES: usize = 96 << 20;
/// How long a signal to a command there may take (an interrupted user
/// waits for it).
const SIGNAL_DEADLINE: Duration = Duration::from_secs(10);
/// How long a copy in or out may take (its bytes travel while the call
/// runs; a copy here has no deadline at all).
const COPY_DEADLINE: Duration = Duration::from_secs(3600);
/// What a browser call may take beyond its page's load bound: the browser
/// started (twice, when it had exited) in a slow guest.
const BROWSER_START_ALLOWANCE: Duration = Duration::from_secs(900);
/// Most bytes of a browser call's answer: a snapshot is cut at 48 KiB, a
/// screenshot of the 1280x720 viewport is a few MiB at most.
const BROWSER_ANSWER_BYTES: u64 = 16 << 20;
/// Most bytes of an answer that carries no data: a command's end, a
/// signal's acknowledgement, a copy's count.
const SMALL_ANSWER_BYTES: u64 = 64 << 10;
/// Most bytes of a `find` answer: its 1000 paths (the guest side's
/// `MAX_FOUND`) of at most 4096 bytes each, every byte escaped.
const FIND_ANSWER_BYTES: u64 = 1000 * 4096 * 6 + (64 << 10);

/// `d` in whole milliseconds, as calls carry waits.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Checks that a server's answer carries at most the `asked` bytes of
/// `what` (a file read, a stream's output): as a guest agent's answer is,
/// it is held to what was asked, whatever else the answer's own bound
/// admits.
pub fn check_answer_bytes(
    server: &str,
    what: &str,
    got: usize,
    asked: u64,
) -> Result<(), ServerError> {
    if u64::try_from(got).map_or(true, |got| got > asked) {
        return Err(ServerError::Garbled {
            server: server.to_owned(),
            detail: format!("its {what} answer carries {got} bytes; {asked} were asked for"),
        });
    }
    Ok(())
}

/// One call on one workspace, as sent to its server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteCall {
    /// The workspace's full name on the server.
    pub workspace: String,
    /// What to do with it.
    pub call: WorkspaceCall,
}

/// The per-workspace calls a server answers: each is the
/// `crate::Workspace` call of the same name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
#[allow(missing_docs)]
pub enum WorkspaceCall {
    Start {
        cold: bool,
        timeout_ms: u64,
    },
    Stop {
        timeout_ms: u64,
    },
    Halt {},
    Hibernate {
        timeout_ms: u64,
    },
    Delete {
        force: bool,
    },
    Inspect {},
    Metrics {},
    SetTtl {
        ttl_secs: Option<u64>,
    },
    ExtendTtl {
        by_secs: u64,
    },
    Logs {
        lines: Option<usize>,
    },
    LogsFrom {
        offset: u64,
    },
    Events {
        after: u64,
        wait_ms: u64,
    },
    SnapshotTake {
        snapshot: Option<String>,
    },
    SnapshotList {},
    Fork {
        new_name: String,
        snapshot: Option<String>,
        timeout_ms: u64,
    },
    PublishPort {
        mapping: PortMapping,
    },
    UnpublishPort {
        host_ip: IpAddr,
        host_port: u16,
    },
    /// A command run to its end (the request as `ExecRequest` writes
    /// itself), its output sent as frames as it comes and its end as the
    /// answer; `wait_ms` is how long it may take. Its stdin is `stdin`, or
    /// with `stdin_follows` the [`super::InputFrame`]s that follow the call
    /// on the server's stdin (data, then `end`), with `terminal_follows` a
    /// terminal's (data and sizes); input that stops without `end` is a
    /// hang-up. With neither, the end of that stdin means the caller went
    /// away. A hang-up or a caller gone kills the command.
    Exec {
        request: serde_json::Value,
        #[serde(default, with = "crate::wire_bytes::optional")]
        stdin: Option<Vec<u8>>,
        #[serde(default)]
        stdin_follows: bool,
        #[serde(default)]
        terminal_follows: bool,
        wait_ms: u64,
    },
    /// A signal to a running command's process group.
    SignalExec {
        exec_id: String,
        signal: i32,
    },
    /// The request and options as `ExecRequest` and `ProcessOptions`
    /// write themselves (this layer is below the guest's).
    ProcessStart {
        request: serde_json::Value,
        options: serde_json::Value,
    },
    ProcessList {},
    ProcessOutput {
        id: String,
        cursors: [u64; 2],
        max_bytes: Option<u64>,
        wait_ms: u64,
    },
    ProcessWriteStdin {
        id: String,
        #[serde(with = "crate::wire_bytes")]
        data: Vec<u8>,
        close: bool,
    },
    ProcessSignal {
        id: String,
        signal: String,
    },
    ProcessWait {
        id: String,
        timeout_ms: u64,
    },
    ProcessRemove {
        id: String,
    },
    ReadFile {
        path: String,
        offset: Option<u64>,
        length: Option<u64>,
    },
    WriteFile {
        path: String,
        #[serde(with = "crate::wire_bytes")]
        data: Vec<u8>,
        append: bool,
        perm: Option<u32>,
    },
    ListDir {
        path: String,
    },
    Stat {
        path: String,
    },
    Mkdir {
        path: String,
    },
    Remove {
        path: String,
        recursive: bool,
        preview: bool,
    },
    Rename {
        from: String,
        to: String,
    },
    EditFile {
        path: String,
        old: String,
        new: String,
        expected: usize,
        // Left out when false, so a server from before previews takes it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        preview: bool,
    },
    ReadLines {
        path: String,
        start_line: usize,
        end_line: Option<usize>,
    },
    Find {
        dir: String,
        pattern: String,
    },
    /// A copy into the guest: what follows the call on the server's stdin
    /// is the file's `bytes` (exactly: an input that ends before is a
    /// cut, and the guest file stays as it was), or with `dir` a
    /// directory's tar archive (`owners`: kept as archived).
    CopyIn {
        guest_path: String,
        dir: bool,
        perm: Option<u32>,
        owners: bool,
        bytes: Option<u64>,
    },
    /// A browser call (`dev.browser()`): the page, its load bound; a
    /// click's or fill's element as `Element` writes itself (this layer is
    /// below the browser's).
    BrowserOpen {
        url: String,
        page: String,
        timeout_ms: u64,
    },
    BrowserSnapshot {
        page: String,
        timeout_ms: u64,
    },
    BrowserAct {
        element: serde_json::Value,
        value: Option<String>,
        page: String,
        timeout_ms: u64,
    },
    BrowserClose {
        page: String,
        timeout_ms: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        preview: bool,
    },
    BrowserScreenshot {
        page: String,
        timeout_ms: u64,
    },
    BrowserEvents {
        offset: u64,
        limit: usize,
    },
    /// A copy out of the guest: the file's bytes, or with `dir` the
    /// directory's tar archive, sent as frames, at most `max_bytes`.
    CopyOut {
        guest_path: String,
        dir: bool,
        max_bytes: u64,
    },
}

impl WorkspaceCall {
    /// How long the server may take: the call's own wait and the trip
    /// (the server holds its own answer to it too).
    pub(crate) fn deadline(&self) -> Duration {
        let waits = |ms: u64| Duration::from_millis(ms).saturating_add(SLACK);
        match self {
            Self::Start { timeout_ms, .. }
            | Self::Stop { timeout_ms }
            | Self::Hibernate { timeout_ms }
            | Self::Fork { timeout_ms, .. }
            | Self::ProcessWait { timeout_ms, .. }
            | Self::Exec {
                wait_ms: timeout_ms,
                ..
            } => waits(*timeout_ms),
            Self::Events { wait_ms, .. } | Self::ProcessOutput { wait_ms, .. } => waits(*wait_ms),
            // Sent when this host's user stops a command: short.
            Self::SignalExec { .. } => SIGNAL_DEADLINE,
            Self::CopyIn { .. } | Self::CopyOut { .. } => COPY_DEADLINE,
            Self::BrowserOpen { timeout_ms, .. }
            | Self::BrowserSnapshot { timeout_ms, .. }
            | Self::BrowserAct { timeout_ms, .. }
            | Self::BrowserClose { timeout_ms, .. }
            | Self::BrowserScreenshot { timeout_ms, .. } => {
                waits(*timeout_ms).saturating_add(BROWSER_START_ALLOWANCE)
            }
            _ => DEFAULT_DEADLINE,
        }
    }

    /// Most bytes its answer may take: a console chunk is held to the
    /// console's cap (in base64) before it is decoded; the largest answer
    /// of the rest is a whole read (64 MiB, base64).
    fn max_answer(&self) -> u64 {
        match self {
            Self::LogsFrom { .. } => base::store::console_log::CONSOLE_LOG_CAP * 4 / 3 + (64 << 10),
            // The bytes asked, in base64, and the record around them.
            Self::ReadFile {
                length: Some(n), ..
            } => n.div_ceil(3).saturating_mul(4).saturating_add(64 << 10),
            Self::Stat { .. } => SMALL_ANSWER_BYTES,
            Self::Find { .. } => FIND_ANSWER_BYTES,
            // A command's end (its output came as frames), a signal's
            // `{}`, a copy's count.
            Self::Exec { .. }
            | Self::SignalExec { .. }
            | Self::CopyIn { .. }
            | Self::CopyOut { .. } => SMALL_ANSWER_BYTES,
            Self::BrowserOpen { .. }
            | Self::BrowserSnapshot { .. }
            | Self::BrowserAct { .. }
            | Self::BrowserClose { .. }
            | Self::BrowserScreenshot { .. } => BROWSER_ANSWER_BYTES,
            // Read through a flattened record, which costs several times
            // its bytes: held lower.
            Self::BrowserEvents { .. } => BROWSER_ANSWER_BYTES / 4,
            _ => MAX_CALL_BYTES as u64,
        }
    }

    /// Its name in errors.
    fn op(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v["op"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// A workspace on a server: where each of its calls goes.
#[derive(Clone, Debug)]
pub struct RemoteWorkspace {
    registry: ServerRegistry,
    server: ServerSpec,
    workspace: String,
}

impl RemoteWorkspace {
    /// Workspace `workspace` on `server` (whose access was checked).
    pub fn new(registry: ServerRegistry, server: ServerSpec, workspace: &str) -> Self {
        Self {
            registry,
            server,
            workspace: workspace.to_owned(),
        }
    }

    /// The server's name.
    pub fn server(&self) -> &str {
        &self.server.name
    }

    /// The server it lives on.
    pub fn spec(&self) -> &ServerSpec {
        &self.server
    }

    /// The workspace's full name.
    pub fn workspace(&self) -> &str {
        &self.workspace
    }

    /// The pool's records on this host (placements, forwards).
    pub(crate) fn registry(&self) -> &ServerRegistry {
        &self.registry
    }

    /// Makes `call` there; its answer read as `T`.
    pub async fn call<T: DeserializeOwned>(&self, call: WorkspaceCall) -> Result<T, ServerError> {
        self.call_streaming(call, RunStreams::default()).await
    }

    /// [`Self::call`] with more input after the call, a held stdin, or
    /// frames before the answer ([`RunStreams`]).
    pub async fn call_streaming<T: DeserializeOwned>(
        &self,
        call: WorkspaceCall,
        streams: RunStreams<'_>,
    ) -> Result<T, ServerError> {
        let deadline = call.deadline();
        let op = call.op();
        let limit = call.max_answer();
        // One line (compact JSON has no raw newline): what follows it on
        // the server's stdin is the call's own input.
        let mut body = serde_json::to_vec(&RemoteCall {
            workspace: self.workspace.clone(),
            call,
        })
        .map_err(|e| ServerError::Invalid(format!("a call that cannot be sent: {e}")))?;
        body.push(b'\n');
        if body.len() > MAX_CALL_BYTES {
            return Err(ServerError::Invalid(format!(
                "{op} on a workspace on server {} carries {} bytes; at most {MAX_CALL_BYTES} go in one call",
                self.server.name,
                body.len()
            )));
        }
        let args = [
            "--json".to_owned(),
            "--server".to_owned(),
            LOCAL_SERVER.to_owned(),
            "workspace-call".to_owned(),
        ];
        let (registry, server) = (&self.registry, &self.server);
        let out =
            run_remote_streaming(registry, server, &args, &body, limit, deadline, streams).await?;
        typed_answer_of(&self.server.name, &out, &op)
    }

    /// [`Self::call`] for a caller that is not async: on a thread of its
    /// own, so it works inside or outside a runtime.
    pub fn call_blocking<T: DeserializeOwned + Send>(
        &self,
        call: WorkspaceCall,
    ) -> Result<T, ServerError> {
        std::thread::scope(|scope| {
            let running = scope.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(ServerError::Spawn)?;
                runtime.block_on(self.call(call))
            });
            running.join().unwrap_or_else(|_| {
                Err(ServerError::Spawn(std::io::Error::other(
                    "the thread of a remote call panicked",
                )))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_of_the_calls_outputs_use_are_held_to_what_they_ask() {
        let read = WorkspaceCall::ReadFile {
            path: "/a".into(),
            offset: None,
            length: Some(1 << 20),
        };
        assert!(read.max_answer() < 2 << 20, "{}", read.max_answer());
        assert!(read.max_answer() > (1 << 20) * 4 / 3);
        let stat = WorkspaceCall::Stat { path: "/a".into() };
        assert!(stat.max_answer() <= 64 << 10);
        let find = WorkspaceCall::Find {
            dir: "/".into(),
            pattern: "*".into(),
        };
        assert!(find.max_answer() < 32 << 20, "{}", find.max_answer());
    }

    #[test]
    fn calls_travel_as_tagged_json_and_refuse_what_they_do_not_know() {
        let call = RemoteCall {
            workspace: "dev".into(),
            call: WorkspaceCall::WriteFile {
                path: "/a".into(),
                data: b"\x00\xffhi".to_vec(),
                append: false,
                perm: None,
            },
        };
        let text = serde_json::to_string(&call).unwrap();
        assert!(text.contains(r#""op":"write_file""#), "{text}");
        assert!(text.contains(r#""data":"AP9oaQ==""#), "{text}");
        assert_eq!(serde_json::from_str::<RemoteCall>(&text).unwrap(), call);
        for hostile in [
            r#"{"workspace":"dev","call":{"op":"run_on_host","argv":["sh"]}}"#,
            r#"{"workspace":"dev","call":{"op":"halt","extra":1}}"#,
            r#"{"workspace":"dev","call":{"op":"halt"},"as":"root"}"#,
            r#"{"workspace":"dev","call":{"op":"write_file","path":"/a","data":"%%%","append":false,"perm":null}}"#,
        ] {
            assert!(
                serde_json::from_str::<RemoteCall>(hostile).is_err(),
                "{hostile}"
            );
        }
        assert_eq!(WorkspaceCall::Halt {}.op(), "halt");
        let wait = WorkspaceCall::Events {
            after: 0,
            wait_ms: 600_000,
        };
        assert_eq!(wait.deadline(), Duration::from_secs(630));
        assert_eq!(WorkspaceCall::Inspect {}.deadline(), DEFAULT_DEADLINE);
        // An interrupted user waits for a signal's answer: not long.
        let signal = WorkspaceCall::SignalExec {
            exec_id: "e".into(),
            signal: 9,
        };
        assert!(signal.deadline() <= Duration::from_secs(10));
        assert!(signal.max_answer() <= 64 << 10);
        // A browser call waits for its page and a slow browser start; its
        // answer is a snapshot or a screenshot, not a whole read.
        let open = WorkspaceCall::BrowserOpen {
            url: "about:blank".into(),
            page: "default".into(),
            timeout_ms: 60_000,
        };
        assert!(open.deadline() >= Duration::from_secs(960));
        assert_eq!(open.max_answer(), 16 << 20);
        let copy = WorkspaceCall::CopyOut {
            guest_path: "/x".into(),
            dir: true,
            max_bytes: 1,
        };
        assert_eq!(copy.max_answer(), SMALL_ANSWER_BYTES);
        // A console chunk's answer is held near the console's cap.
        let logs = WorkspaceCall::LogsFrom { offset: 0 }.max_answer();
        assert!(logs < 2 << 20 && logs > base::store::console_log::CONSOLE_LOG_CAP * 4 / 3);
    }

    #[test]
    fn an_answer_carrying_more_than_was_asked_for_is_garbled() {
        check_answer_bytes("box", "read_file", 10, 10).unwrap();
        check_answer_bytes("box", "read_file", 0, 0).unwrap();
        for (got, asked) in [(11, 10), (1, 0), (usize::MAX, u64::MAX - 1)] {
            match check_answer_bytes("box", "read_file", got, asked) {
                Err(ServerError::Garbled { server, detail }) => {
                    assert_eq!(server, "box");
                    assert!(detail.contains("read_file"), "{detail}");
                }
                other => panic!("{got} of {asked}: {other:?}"),
            }
        }
    }
}
