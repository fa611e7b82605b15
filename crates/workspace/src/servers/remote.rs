//! Running `microagent` on a server over SSH with a deadline, and reading
//! its JSON answer or its JSON error.

use std::process::Stdio;
use std::time::Duration;

use super::registry::ServerRegistry;
use super::spec::ServerSpec;
use super::ssh::{self, SSH_FAILED};
use super::ServerError;
use base::code::ErrorCode;

/// How long a remote operation may take unless its caller says.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);
/// How long a status probe may take.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(30);

/// Most bytes of a remote `microagent`'s stdout read (its JSON answer;
/// an exec's output is capped far below this on the server).
pub const MAX_REMOTE_STDOUT: u64 = 256 << 20;
/// Most bytes of its stderr kept (the rest is read and dropped).
const MAX_REMOTE_STDERR: u64 = 1 << 20;

/// What a remote `microagent` printed and how it ended.
#[derive(Clone, Debug)]
pub struct RemoteOutput {
    /// Its exit status.
    pub status: i32,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: String,
}

/// What else a remote run exchanges besides its input and its answer.
#[derive(Default)]
pub struct RunStreams<'a> {
    /// Sent after the input, to its end (a command's stdin).
    pub then_input: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    /// Keeps the remote's stdin open until the answer is read, so that its
    /// end tells the remote this host went away (when nothing follows).
    pub hold_input: bool,
    /// Takes the frames the remote prints before its answer (without it a
    /// frame is part of the answer).
    pub on_frame: Option<super::frames::OnFrame<'a>>,
}

impl std::fmt::Debug for RunStreams<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStreams")
            .field("then_input", &self.then_input.is_some())
            .field("hold_input", &self.hold_input)
            .field("on_frame", &self.on_frame.is_some())
            .finish()
    }
}

/// Runs `microagent ARGS` on `spec` with `input` on its stdin (none: an
/// empty one), its output collected, at most `max_stdout` bytes of it.
/// ssh's own failure is [`ServerError::Unreachable`]; past `deadline` ssh
/// is killed and it is [`ServerError::Deadline`].
pub async fn run_remote(
    registry: &ServerRegistry,
    spec: &ServerSpec,
    args: &[String],
    input: &[u8],
    max_stdout: u64,
    deadline: Duration,
) -> Result<RemoteOutput, ServerError> {
    let streams = RunStreams::default();
    run_remote_streaming(registry, spec, args, input, max_stdout, deadline, streams).await
}

/// [`run_remote`] with [`RunStreams`]: more input after `input`, a held
/// stdin, and frames before the answer (a frame that is not one is
/// [`ServerError::Garbled`]).
pub async fn run_remote_streaming(
    registry: &ServerRegistry,
    spec: &ServerSpec,
    args: &[String],
    input: &[u8],
    max_stdout: u64,
    deadline: Duration,
    streams: RunStreams<'_>,
) -> Result<RemoteOutput, ServerError> {
    let RunStreams {
        then_input,
        hold_input,
        on_frame,
    } = streams;
    let line = ssh::remote_line(spec, args);
    let mut cmd = tokio::process::Command::from(registry.ssh_command(spec, &line, false)?);
    let piped = !input.is_empty() || then_input.is_some() || hold_input;
    cmd.stdin(match piped {
        false => Stdio::null(),
        true => Stdio::piped(),
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(ServerError::Spawn)?;
    let stdin = child.stdin.take();
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ServerError::Spawn(std::io::Error::other(
            "ssh has no pipes",
        )));
    };
    let late = || ServerError::Deadline {
        server: spec.name.clone(),
        secs: deadline.as_secs(),
    };
    // Both pipes are read at once, each up to its bound, so a server
    // that floods either can neither block ssh nor fill this process.
    // The input is written while the answer is read: a remote that
    // answers before reading all of it cannot stall either side.
    let feed = async {
        use tokio::io::AsyncWriteExt;
        if let Some(mut stdin) = stdin {
            // A remote that stops reading early ends the write; its answer
            // says why.
            let _ = stdin.write_all(input).await;
            if let Some(mut more) = then_input {
                let _ = tokio::io::copy(&mut more, &mut stdin).await;
            } else if hold_input {
                // Dropped (closed) once the answer is in.
                std::future::pending::<()>().await;
            }
        }
    };
    let read = async {
        use tokio::io::AsyncReadExt;
        let mut err = Vec::new();
        let mut stderr = stderr;
        let stdout_read = async {
            match on_frame {
                Some(on_frame) => {
                    let reader = tokio::io::BufReader::new(stdout);
                    super::frames::read_frames_then_answer(reader, max_stdout, on_frame).await
                }
                None => {
                    let mut out = Vec::new();
                    stdout.take(max_stdout + 1).read_to_end(&mut out).await?;
                    Ok(out)
                }
            }
        };
        let stderr_read = async {
            (&mut stderr)
                .take(MAX_REMOTE_STDERR)
                .read_to_end(&mut err)
                .await?;
            tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await
        };
        let (a, b) = tokio::join!(stdout_read, stderr_read);
        let out = a?;
        b?;
        Ok::<_, std::io::Error>((out, err))
    };
    // The feed may outlive the answer (a held stdin): the answer decides.
    let both = async {
        tokio::pin!(feed);
        tokio::pin!(read);
        let mut fed = false;
        loop {
            tokio::select! {
                done = &mut read => return done,
                () = &mut feed, if !fed => fed = true,
            }
        }
    };
    // One deadline for the answer and the exit both.
    let until = tokio::time::Instant::now() + deadline;
    let (stdout, stderr) = tokio::time::timeout_at(until, both)
        .await
        .map_err(|_| late())?
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => ServerError::Garbled {
                server: spec.name.clone(),
                detail: e.to_string(),
            },
            _ => ServerError::Spawn(e),
        })?;
    // Past the bound, ssh is killed when `child` is dropped.
    if stdout.len() as u64 > max_stdout {
        return Err(ServerError::AnswerTooLarge {
            server: spec.name.clone(),
            limit: max_stdout,
        });
    }
    let status = tokio::time::timeout_at(until, child.wait())
        .await
        .map_err(|_| late())?
        .map_err(ServerError::Spawn)?
        .code()
        .unwrap_or(SSH_FAILED);
    let stderr = String::from_utf8_lossy(&stderr).into_owned();
    if status == SSH_FAILED && stdout.is_empty() {
        return Err(ServerError::Unreachable {
            server: spec.name.clone(),
            detail: last_line(&stderr),
        });
    }
    Ok(RemoteOutput {
        status,
        stdout,
        stderr,
    })
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("ssh failed")
        .trim()
        .to_owned()
}

/// Runs `microagent ARGS --json` on `spec` and returns its JSON answer; its
/// JSON error becomes [`ServerError::Remote`] with the remote's code.
pub async fn run_remote_json(
    registry: &ServerRegistry,
    spec: &ServerSpec,
    args: &[String],
    deadline: Duration,
) -> Result<serde_json::Value, ServerError> {
    // First: after a `--` it would be the guest command's.
    let mut args = args.to_vec();
    args.insert(0, "--json".into());
    let out = run_remote(registry, spec, &args, &[], MAX_REMOTE_STDOUT, deadline).await?;
    answer_of(&spec.name, &out)
}

/// Most bytes of a failed remote's stdout read as its JSON error.
const MAX_ERROR_ANSWER: usize = 1 << 20;

/// What a remote that printed one JSON document of type `T` (its answer
/// to `what`) said, read straight into `T`: no shapeless document is built
/// first, so what a hostile server sends costs no more than `T` holds.
/// A failure's JSON error keeps its code, as [`run_remote_json`]'s does.
pub(crate) fn typed_answer_of<T: serde::de::DeserializeOwned>(
    server: &str,
    out: &RemoteOutput,
    what: &str,
) -> Result<T, ServerError> {
    let garbled = |detail: String| ServerError::Garbled {
        server: server.to_owned(),
        detail,
    };
    if out.status == 0 {
        return serde_json::from_slice(&out.stdout)
            .map_err(|e| garbled(format!("its {what} answer: {e}")));
    }
    if out.stdout.len() > MAX_ERROR_ANSWER {
        return Err(garbled(format!(
            "its {what} failed with {} bytes of answer; an error is at most {MAX_ERROR_ANSWER}",
            out.stdout.len()
        )));
    }
    match answer_of(server, out) {
        Err(e) => Err(e),
        Ok(_) => Err(garbled(format!(
            "its {what} failed (exit {}) without an error; its stderr: {}",
            out.status,
            last_line(&out.stderr)
        ))),
    }
}

/// The JSON answer in what a remote `microagent --json` printed: what a
/// server sends is data, read as JSON only, and its error's code must be
/// one of the stable codes.
fn answer_of(server: &str, out: &RemoteOutput) -> Result<serde_json::Value, ServerError> {
    let garbled = |detail: String| ServerError::Garbled {
        server: server.to_owned(),
        detail,
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // One JSON document, or one per line (the last one says how it ended).
    let value: serde_json::Value = match serde_json::from_str(text.trim()) {
        Ok(v) => v,
        Err(_) => match text.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(last) => serde_json::from_str(last)
                .map_err(|e| garbled(format!("{e}; its stderr: {}", last_line(&out.stderr))))?,
            None => {
                return Err(garbled(format!(
                    "nothing on stdout, exit {}; its stderr: {}",
                    out.status,
                    last_line(&out.stderr)
                )))
            }
        },
    };
    if let Some(error) = value.get("error").filter(|_| out.status != 0) {
        let code: ErrorCode = serde_json::from_value(error["code"].clone())
            .map_err(|e| garbled(format!("an error without a known code: {e}")))?;
        return Err(ServerError::Remote {
            server: server.to_owned(),
            code,
            message: error["message"].as_str().unwrap_or("").to_owned(),
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(status: i32, stdout: &[u8]) -> RemoteOutput {
        RemoteOutput {
            status,
            stdout: stdout.to_vec(),
            stderr: "ssh: last words\n".into(),
        }
    }

    #[test]
    fn a_servers_hostile_answers_are_data_or_garbled_never_more() {
        let garbled = |o: &RemoteOutput| match answer_of("s1", o) {
            Err(ServerError::Garbled { server, detail }) => {
                assert_eq!(server, "s1");
                detail
            }
            other => panic!("{other:?}"),
        };
        // Nothing, binary junk, a torn document.
        assert!(garbled(&out(0, b"")).contains("nothing on stdout"));
        garbled(&out(0, &[0xff, 0xfe, 0x00, b'{']));
        garbled(&out(0, b"{\"name\": \"w\""));
        // Nesting past serde_json's depth is an error, not a stack overflow.
        let deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
        garbled(&out(0, deep.as_bytes()));
        // An error whose code is not one of the stable codes.
        let odd = br#"{"error": {"code": "ROOT_PLEASE", "message": "x"}}"#;
        assert!(garbled(&out(1, odd)).contains("without a known code"));
        // A known code is kept; the message stays text, escapes and all.
        let known = br#"{"error": {"code": "FORBIDDEN", "message": "no\u001b[2J"}}"#;
        match answer_of("s1", &out(1, known)) {
            Err(ServerError::Remote { code, message, .. }) => {
                assert_eq!(code, ErrorCode::Forbidden);
                assert_eq!(message, "no\u{1b}[2J");
            }
            other => panic!("{other:?}"),
        }
        // An "error" on success is data; of several lines the last counts.
        let value = answer_of("s1", &out(0, odd)).unwrap();
        assert_eq!(value["error"]["code"], "ROOT_PLEASE");
        let lines = b"{\"progress\": 1}\nnot json\n{\"done\": true}\n";
        assert_eq!(answer_of("s1", &out(0, lines)).unwrap()["done"], true);
    }

    #[test]
    fn a_typed_answer_is_read_as_its_type_only() {
        #[derive(Debug, serde::Deserialize)]
        struct Size {
            size: u64,
        }
        let typed = |o: &RemoteOutput| typed_answer_of::<Size>("s1", o, "stat");
        assert_eq!(typed(&out(0, br#"{"size": 6}"#)).unwrap().size, 6);
        // A flood of tiny items where an object belongs fails at its first
        // byte instead of being built (a shapeless parse would hold ~30
        // bytes per item); so does a deep nest, a wrong type, trailing junk.
        let flood = format!("[{}0]", "0,".repeat(4 << 20));
        let deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
        for bad in [
            flood.as_bytes(),
            deep.as_bytes(),
            br#"{"size": "6"}"#,
            br#"{"size": 6} {"size": 7}"#,
            b"",
        ] {
            let refused = typed(&out(0, bad)).unwrap_err();
            assert!(matches!(refused, ServerError::Garbled { .. }), "{refused}");
        }
        // A failure keeps its stable code; one without an error, or with
        // an error too large to be one, is garbled.
        let forbidden = br#"{"error": {"code": "FORBIDDEN", "message": "no"}}"#;
        match typed(&out(1, forbidden)) {
            Err(ServerError::Remote { code, .. }) => assert_eq!(code, ErrorCode::Forbidden),
            other => panic!("{other:?}"),
        }
        let huge = format!(
            r#"{{"error": {{"code": "FORBIDDEN", "message": "{}"}}}}"#,
            "x".repeat(2 << 20)
        );
        for bad in [br#"{"size": 6}"#.as_slice(), huge.as_bytes()] {
            let refused = typed(&out(1, bad)).unwrap_err();
            assert!(matches!(refused, ServerError::Garbled { .. }), "{refused}");
        }
    }
}
