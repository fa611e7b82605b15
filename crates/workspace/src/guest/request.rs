//! A command as the library asks for it ([`ExecRequest`]) and what comes
//! back ([`Exited`], [`ExecResult`], the [`OutputCollector`] that makes
//! one from streamed events): the records both a run here (`exec`) and
//! one on a server (`exec_remote`) use. The agent's wire format stays
//! behind this module and `exec`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use guest_agent::protocol as wire;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::guest::stream::{ExecEvent, PtySize};
use crate::secrets::{SecretError, SecretValue};

/// What runs: a program with its arguments, or a shell line.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Program {
    Argv(Vec<String>),
    Shell(String),
}

/// A command to run in a workspace: a program with arguments or a
/// `/bin/sh -c` line, with its environment, directory and limits.
///
/// ```
/// use std::time::Duration;
/// let req = workspace::ExecRequest::shell("make test")
///     .cwd("/src")
///     .env("CI", "1")
///     .timeout(Duration::from_secs(600));
/// assert_eq!(req.describe(), "make test");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub(crate) program: Program,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) cwd: Option<String>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) output_cap: Option<u64>,
    pub(crate) id: Option<String>,
    pty: Option<PtySize>,
    pub(crate) user: Option<String>,
    pub(crate) root: Option<String>,
    /// Names only: values are read when the agent's request is built.
    pub(crate) secrets: BTreeSet<String>,
}

impl ExecRequest {
    fn new(program: Program) -> Self {
        Self {
            program,
            env: BTreeMap::new(),
            cwd: None,
            timeout: None,
            output_cap: None,
            id: None,
            pty: None,
            user: None,
            root: None,
            secrets: BTreeSet::new(),
        }
    }

    /// Runs `argv[0]` (looked up in the guest's `PATH`) with the rest as
    /// its arguments, without a shell.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(Program::Argv(argv.into_iter().map(Into::into).collect()))
    }

    /// Runs `line` with `/bin/sh -c` (pipes, redirections, globs).
    pub fn shell(line: impl Into<String>) -> Self {
        Self::new(Program::Shell(line.into()))
    }

    /// Adds an environment variable (over the workspace's own).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Adds environment variables (over the workspace's own).
    pub fn envs<I, K, V>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Gives the command secret `name` (see [`crate::secrets`]) as the
    /// environment variable `name`. Only the name is kept here: the value
    /// is read from the store when the command starts (an unknown name is
    /// NOT_FOUND and nothing runs), reaches the guest process's
    /// environment and nothing else, and is masked (`***`) in its output.
    pub fn secret(mut self, name: impl Into<String>) -> Self {
        self.secrets.insert(name.into());
        self
    }

    /// Gives the command each of these secrets ([`ExecRequest::secret`]).
    pub fn secrets<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.secrets.extend(names.into_iter().map(Into::into));
        self
    }

    /// The names of the secrets it is given.
    pub fn secret_names(&self) -> Vec<String> {
        self.secrets.iter().cloned().collect()
    }

    /// Sets the working directory in the guest (default `/`).
    pub fn cwd(mut self, dir: impl Into<String>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Runs the command with guest directory `dir` as its root: in a mount
    /// namespace of its own with the guest's /proc, /dev and /sys mounted
    /// inside, chrooted. Its program, working directory and user are then
    /// looked up inside `dir` (the containerd shim runs a pod's later
    /// containers each in its own root filesystem this way).
    pub fn root(mut self, dir: impl Into<String>) -> Self {
        self.root = Some(dir.into());
        self
    }

    /// Kills the command's process group once it has run this long.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Every byte of output sent back, however much there is: for a caller
    /// of [`Workspace::exec`] that writes each event out and keeps none
    /// (collecting it all would hold it all in memory).
    pub fn uncapped_output(self) -> Self {
        self.output_cap(guest_agent::protocol::UNCAPPED_OUTPUT)
    }

    /// Bytes of each output stream sent back; the rest is only counted
    /// (default: the agent's, 1 MiB).
    pub fn output_cap(mut self, bytes: u64) -> Self {
        self.output_cap = Some(bytes);
        self
    }

    /// Runs the command on a pseudo-terminal of this size in the guest:
    /// it sees a tty on stdin, stdout and stderr, output arrives as stdout
    /// only, and input comes as [`crate::guest::TerminalInput`]
    /// ([`ExecInput::Terminal`]), which carries size changes too.
    pub fn terminal(mut self, size: PtySize) -> Self {
        self.pty = Some(size);
        self
    }

    /// The command as text: the arguments joined by spaces, or the shell
    /// line (what the workspace's events record).
    pub fn describe(&self) -> String {
        match &self.program {
            Program::Argv(argv) => argv.join(" "),
            Program::Shell(line) => line.clone(),
        }
    }

    /// Refuses a command with no program, a root that is not an absolute
    /// guest path, a bad secret name, or a secret that is also a plain
    /// variable of the request.
    pub(crate) fn check(&self) -> Result<()> {
        if let Some(root) = self.root.as_ref().filter(|r| !r.starts_with('/')) {
            return Err(Error::InvalidInput(format!(
                "root {root:?} is not an absolute guest path; guest paths start with /"
            )));
        }
        if let Program::Argv(argv) = &self.program {
            if argv.is_empty() {
                return Err(Error::InvalidInput(
                    "no command given; pass a program and its arguments, or a shell line".into(),
                ));
            }
        }
        for name in &self.secrets {
            crate::secrets::validate_secret_name(name)?;
            if self.env.contains_key(name) {
                return Err(SecretError::EnvClash(name.clone()).into());
            }
        }
        Ok(())
    }

    /// Runs as `user` instead of the workspace's default (its image's, else
    /// root): a name the guest's /etc/passwd lists (`root`, `node`), a uid,
    /// or `user:group`; resolved in the guest, `INVALID_INPUT` when it
    /// names nobody.
    pub fn user(mut self, user: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self
    }

    /// The agent's request, with the workspace's `env` under the request's
    /// and its working directory and user (its image's) as defaults, and
    /// the secrets' `values` (resolved from its names) over both.
    pub(crate) fn into_wire(
        self,
        spec: &base::store::spec::WorkspaceSpec,
        values: &[(String, SecretValue)],
    ) -> wire::ExecCall {
        let mut req = match self.program {
            Program::Argv(argv) => wire::ExecCall::argv(argv),
            Program::Shell(line) => wire::ExecCall::shell(line),
        };
        req.env = spec.env.clone();
        req.env.extend(self.env);
        req.env.extend(
            values
                .iter()
                .map(|(k, v)| (k.clone(), v.expose().to_owned())),
        );
        req.cwd = self.cwd.or_else(|| spec.cwd.clone());
        match (self.user, spec.user) {
            (Some(user), _) => req.user = Some(user),
            (None, Some((uid, gid))) => {
                req.uid = Some(uid);
                req.gid = Some(gid);
            }
            (None, None) => {}
        }
        if let Some(t) = self.timeout {
            req = req.timeout(t);
        }
        req.output_cap = self.output_cap;
        req.id = self.id;
        req.root = self.root;
        if let Some(size) = self.pty {
            req = req.pty(size.into());
        }
        req
    }
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Exited {
    /// The exec's id, as the workspace's events name it.
    pub exec_id: String,
    /// Exit code, when the process exited.
    pub code: Option<i32>,
    /// Signal number, when a signal killed it.
    pub signal: Option<i32>,
    /// True when its timeout killed it.
    pub timed_out: bool,
    /// Milliseconds from start to end.
    pub wall_ms: u64,
    /// Bytes it wrote to stdout.
    pub stdout_bytes: u64,
    /// Bytes it wrote to stderr.
    pub stderr_bytes: u64,
    /// Stdout bytes past the output cap: counted, not sent.
    pub stdout_dropped: u64,
    /// Stderr bytes past the output cap: counted, not sent.
    pub stderr_dropped: u64,
}

impl Exited {
    /// True when the process exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl From<wire::ExecExit> for Exited {
    fn from(e: wire::ExecExit) -> Self {
        Self {
            exec_id: e.exec_id,
            code: e.code,
            signal: e.signal,
            timed_out: e.timed_out,
            wall_ms: e.wall_ms,
            stdout_bytes: e.stdout_bytes,
            stderr_bytes: e.stderr_bytes,
            stdout_dropped: e.stdout_dropped,
            stderr_dropped: e.stderr_dropped,
        }
    }
}

/// How a command ended and what it printed: the one result every front
/// end returns (the CLI's `--json`, the MCP server's tools).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ExecResult {
    /// The agent's id of this command (the workspace's events name it).
    pub exec_id: String,
    /// Exit code, when the command exited.
    pub exit_code: Option<i32>,
    /// Signal number, when a signal killed it.
    pub signal: Option<i32>,
    /// True when its timeout killed it.
    pub timed_out: bool,
    /// Milliseconds from start to end.
    pub wall_ms: u64,
    /// Its stdout, up to the output cap (invalid UTF-8 replaced).
    pub stdout: String,
    /// Its stderr, up to the output cap (invalid UTF-8 replaced).
    pub stderr: String,
    /// Bytes it wrote to stdout.
    pub stdout_bytes: u64,
    /// Bytes it wrote to stderr.
    pub stderr_bytes: u64,
    /// Stdout bytes past the cap: counted, not returned.
    pub stdout_dropped: u64,
    /// Stderr bytes past the cap: counted, not returned.
    pub stderr_dropped: u64,
}

impl ExecResult {
    /// True when the command exited with code 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }

    /// True when output past the cap was dropped.
    pub fn output_dropped(&self) -> bool {
        self.stdout_dropped > 0 || self.stderr_dropped > 0
    }
}

/// Gathers a command's output while it runs, up to a cap per stream, into
/// an [`ExecResult`]: feed it the events, then [`OutputCollector::finish`].
#[derive(Debug, Default)]
pub struct OutputCollector {
    cap: u64,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// Bytes past the cap the agent sent anyway (an agent that ignores the
    /// request's cap is not believed).
    over_cap: [u64; 2],
    pid: Option<u32>,
}

/// The most a collector keeps of one stream, whatever was asked: output
/// past it is counted as dropped, so a guest cannot make the host grow
/// without bound.
pub const MAX_COLLECTED_BYTES: u64 = 64 << 20;

impl OutputCollector {
    /// Keeps at most `cap` bytes of each stream (without one, and never
    /// more than, [`MAX_COLLECTED_BYTES`]).
    pub fn new(cap: Option<u64>) -> Self {
        Self {
            cap: cap.unwrap_or(MAX_COLLECTED_BYTES).min(MAX_COLLECTED_BYTES),
            ..Self::default()
        }
    }

    /// Records one event.
    pub fn on_event(&mut self, event: ExecEvent) {
        match event {
            ExecEvent::Started { pid, .. } => self.pid = Some(pid),
            ExecEvent::Stdout(b) => self.over_cap[0] += keep(&mut self.stdout, &b, self.cap),
            ExecEvent::Stderr(b) => self.over_cap[1] += keep(&mut self.stderr, &b, self.cap),
        }
    }

    /// The command's pid (and process group) in the guest, once started.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The result of the command that ended as `exited`.
    pub fn finish(self, exited: Exited) -> ExecResult {
        ExecResult {
            exec_id: exited.exec_id,
            exit_code: exited.code,
            signal: exited.signal,
            timed_out: exited.timed_out,
            wall_ms: exited.wall_ms,
            stdout: String::from_utf8_lossy(&self.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&self.stderr).into_owned(),
            stdout_bytes: exited.stdout_bytes,
            stderr_bytes: exited.stderr_bytes,
            stdout_dropped: exited.stdout_dropped.saturating_add(self.over_cap[0]),
            stderr_dropped: exited.stderr_dropped.saturating_add(self.over_cap[1]),
        }
    }
}

/// Appends what fits under `cap` to `buf`; returns the bytes left out.
fn keep(buf: &mut Vec<u8>, chunk: &[u8], cap: u64) -> u64 {
    let room = usize::try_from(cap)
        .unwrap_or(usize::MAX)
        .saturating_sub(buf.len());
    let taken = chunk.len().min(room);
    buf.extend_from_slice(&chunk[..taken]);
    (chunk.len() - taken) as u64
}

/// How long past an exec's own timeout the host waits for the agent to
/// report its end.
pub const EXEC_DEADLINE_GRACE: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn the_request_carries_everything_to_the_agent() {
        let req = ExecRequest::argv(["ls", "-l"])
            .env("A", "request")
            .envs([("B", "2")])
            .cwd("/tmp")
            .timeout(Duration::from_millis(1500))
            .output_cap(10)
            .root("/var/lib/ctr/a");
        assert_eq!(req.describe(), "ls -l");
        let spec = base::store::spec::WorkspaceSpec {
            env: BTreeMap::from([
                ("A".to_owned(), "workspace".to_owned()),
                ("C".to_owned(), "3".to_owned()),
            ]),
            cwd: Some("/app".into()),
            user: Some((1000, 1001)),
            ..Default::default()
        };
        let wire = req.clone().into_wire(&spec, &[]);
        assert_eq!(wire.argv, Some(vec!["ls".to_owned(), "-l".to_owned()]));
        assert_eq!(wire.shell, None);
        assert_eq!(wire.env["A"], "request", "the request's env wins");
        assert_eq!(wire.env["B"], "2");
        assert_eq!(wire.env["C"], "3");
        assert_eq!(wire.cwd.as_deref(), Some("/tmp"));
        assert_eq!(wire.timeout_ms, Some(1500));
        assert_eq!(wire.output_cap, Some(10));
        assert_eq!(wire.root.as_deref(), Some("/var/lib/ctr/a"));
        assert_eq!((wire.uid, wire.gid), (Some(1000), Some(1001)));
        let as_root = ExecRequest::argv(["id"]).user("root").into_wire(&spec, &[]);
        assert_eq!((as_root.user.as_deref(), as_root.uid), (Some("root"), None));
        let no_cwd = ExecRequest::argv(["ls"]).into_wire(&spec, &[]);
        assert_eq!(
            no_cwd.cwd.as_deref(),
            Some("/app"),
            "the image's cwd by default"
        );
    }

    #[test]
    fn a_secret_is_a_name_until_the_wire() {
        let req = ExecRequest::shell("echo $TOKEN")
            .secret("TOKEN")
            .env("PLAIN", "1");
        assert_eq!(req.secret_names(), ["TOKEN"]);
        assert!(req.check().is_ok());
        let shown = format!("{} {req:?}", req.describe());
        assert!(!shown.contains("hunter2"), "{shown}");
        let value = SecretValue::new("TOKEN", b"hunter2".to_vec()).unwrap();
        let spec = base::store::spec::WorkspaceSpec {
            env: BTreeMap::from([("TOKEN".to_owned(), "from-spec".to_owned())]),
            ..Default::default()
        };
        let wire = req.into_wire(&spec, &[("TOKEN".to_owned(), value)]);
        assert_eq!(wire.env["TOKEN"], "hunter2", "the secret wins");
        assert_eq!(wire.env["PLAIN"], "1");
        assert_eq!(wire.shell.as_deref(), Some("echo $TOKEN"));
        let clash = ExecRequest::shell("x").env("T", "1").secret("T");
        assert_eq!(
            clash.check().unwrap_err().code(),
            base::code::ErrorCode::InvalidInput
        );
        let bad = ExecRequest::shell("x").secret("A-B");
        assert_eq!(
            bad.check().unwrap_err().code(),
            base::code::ErrorCode::InvalidInput
        );
    }

    #[test]
    fn a_shell_line_goes_as_one_string() {
        let wire = ExecRequest::shell("echo hi | wc -c").into_wire(&Default::default(), &[]);
        assert_eq!(wire.shell.as_deref(), Some("echo hi | wc -c"));
        assert_eq!(wire.argv, None);
    }

    #[test]
    fn an_empty_argv_is_refused() {
        let err = ExecRequest::argv(Vec::<String>::new()).check().unwrap_err();
        assert_eq!(err.code(), base::code::ErrorCode::InvalidInput);
        assert!(ExecRequest::shell("true").check().is_ok());
        let relative_root = ExecRequest::shell("true").root("ctr/a").check();
        assert_eq!(
            relative_root.unwrap_err().code(),
            base::code::ErrorCode::InvalidInput
        );
    }

    #[test]
    fn the_collector_keeps_up_to_the_cap_and_the_pid() {
        let mut c = OutputCollector::new(Some(4));
        c.on_event(ExecEvent::Started {
            exec_id: "e1".into(),
            pid: 42,
        });
        c.on_event(ExecEvent::Stdout(b"abc".to_vec()));
        c.on_event(ExecEvent::Stdout(b"def".to_vec()));
        c.on_event(ExecEvent::Stderr(vec![0xff, b'x']));
        assert_eq!(c.pid(), Some(42));
        let result = c.finish(Exited {
            exec_id: "e1".into(),
            code: Some(0),
            signal: None,
            timed_out: false,
            wall_ms: 5,
            stdout_bytes: 6,
            stderr_bytes: 2,
            stdout_dropped: 0,
            stderr_dropped: 0,
        });
        assert_eq!(result.stdout, "abcd");
        assert_eq!(result.stderr, "\u{fffd}x", "invalid UTF-8 is replaced");
        assert_eq!(result.stdout_bytes, 6);
        assert!(result.success());
        // The agent sent past the cap and said nothing was dropped: the
        // host counts what it left out itself.
        assert_eq!(result.stdout_dropped, 2);
        assert!(result.output_dropped());
        assert_eq!(OutputCollector::new(None).cap, MAX_COLLECTED_BYTES);
        assert_eq!(
            OutputCollector::new(Some(u64::MAX)).cap,
            MAX_COLLECTED_BYTES
        );
    }
}
