//! A session's kernel process in the guest (`server` starts it): the wait
//! for the file a starting kernel (or the kernel server) writes, while it
//! works, with what it said when it ends first; that file read back as
//! guest data (bounded, owner checked) and a connection file's ports and
//! key; the tunnels through the agent's `tcp_connect` to the kernel; its
//! end.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::net::UnixStream;

use super::jupyter::JupyterClient;
use super::records::SessionRecord;
use super::{javascript, CodeLanguage, CodeSessionError};
use base::store::workspace_dir::WorkspaceDir;

use crate::error::{Error, Result};
use crate::guest::files::FileKind;
use crate::guest::processes::{CpuProgress, ProcessOutput};
use crate::workspaces::handle::Workspace;

/// How long a starting kernel may go without output or CPU time spent.
const START_QUIET: Duration = Duration::from_secs(120);
/// How long a kernel that keeps working may take to write its connection
/// file (importing ipykernel where guest kernel mode is emulated takes
/// minutes: 240-350 s measured alone, 16.5 min beside other guests and a
/// build); one that stops working is ended after [`START_QUIET`].
const START_CEILING: Duration = Duration::from_secs(3600);
/// How long a kernel may take from its connection file to its first
/// answer (its shell's set-up, a minute or more on such a host).
pub(crate) const FIRST_ANSWER_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest single wait for the kernel's output while it starts: each
/// poll is agent work on the guest's vCPU, which the import needs (the
/// kernel prints as it writes its connection file, ending the wait).
const START_POLL: Duration = Duration::from_secs(5);
/// The kernels' address: given, so ipykernel runs no `ip` or `ifconfig`
/// to find its loopback's (a process costs seconds in such a guest).
pub const KERNEL_IP_ARG: &str = "--ip=127.0.0.1";
/// Polls in a row whose agent connection the guest may leave unanswered
/// while a kernel starts (each is the VMM's 10 s connect deadline).
const MAX_UNANSWERED: u32 = 6;
/// Largest connection file read.
const MAX_CONNECTION_FILE: u64 = 4096;

/// The guest path of kernel process `process`'s connection file.
pub(crate) fn connection_file(process: &str, nonce: &str) -> String {
    format!("/tmp/.microagent-{process}-{nonce}.json")
}

/// Waits, at most [`START_CEILING`] while background process `id` (pid
/// `pid`, starting a `language` kernel or the kernel server) works, for
/// `file` to be whole by `parse`; what it prints to stderr is kept for
/// the error when it ends first.
pub(crate) async fn wait_for<T>(
    ws: Workspace<'_>,
    id: &str,
    pid: u32,
    language: CodeLanguage,
    file: &str,
    parse: impl Fn(&Value, u32) -> Result<Option<T>, CodeSessionError>,
) -> Result<T> {
    let started = Instant::now();
    // None when it ended already: the first poll of its output says so.
    let owner = process_owner(ws, pid).await.ok();
    let mut progress = CpuProgress::new(pid);
    let mut said = String::new();
    let mut cursors = [0, 0];
    let mut unanswered = 0;
    let waited = async {
        loop {
            let polled = async {
                let json = match owner {
                    Some(owner) => read_guest_json(ws, file, owner).await?,
                    None => None,
                };
                if let Some(json) = json {
                    if let Some(found) = parse(&json, pid)? {
                        return Ok(Poll::Written(found));
                    }
                }
                let out = ws
                    .processes()
                    .process_output(id, cursors, Some(16 * 1024), START_POLL)
                    .await?;
                Ok::<_, Error>(Poll::Output(Box::new(out)))
            };
            // A guest that leaves a call unanswered does not hold the
            // start past the quiet limit.
            let polled = tokio::time::timeout(START_QUIET, polled)
                .await
                .unwrap_or_else(|_| {
                    let why = format!("a poll went unanswered for {} s", START_QUIET.as_secs());
                    Err(start_failed(ws, language, why))
                });
            let out = match polled {
                Ok(Poll::Written(found)) => return Ok(found),
                Ok(Poll::Output(out)) => {
                    unanswered = 0;
                    out
                }
                // The guest, busy importing, let a connection go
                // unanswered: the next poll asks again.
                Err(e) if unanswered_connect(&e) && unanswered < MAX_UNANSWERED => {
                    unanswered += 1;
                    tracing::debug!(workspace = %ws.name, unanswered, "a kernel's start poll went unanswered");
                    tokio::time::sleep(START_POLL).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            cursors = [out.stdout.next_cursor, out.stderr.next_cursor];
            if out.stdout.bytes.is_empty() && out.stderr.bytes.is_empty() {
                progress.sample(ws).await;
            } else {
                progress.last = Instant::now();
            }
            said.push_str(&String::from_utf8_lossy(&out.stderr.bytes));
            keep_tail(&mut said);
            if !out.process.running() {
                let _ = ws.processes().process_remove(id).await;
                if let Some(looked_for) = missing(language, &said) {
                    return Err(CodeSessionError::NotInstalled {
                        workspace: ws.name.as_str().to_owned(),
                        language: language.as_str(),
                        looked_for: looked_for.into(),
                    }
                    .into());
                }
                let tail: Vec<&str> = said.lines().rev().take(5).collect();
                let why = format!(
                    "{}: {}",
                    out.process.status(),
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                );
                return Err(start_failed(ws, language, why));
            }
            let quiet = progress.last.elapsed() > START_QUIET;
            if quiet || started.elapsed() > START_CEILING {
                let _ = ws.processes().process_signal(id, "KILL").await;
                let _ = ws.processes().process_remove(id).await;
                let why = if quiet {
                    format!("no output and no CPU time for {} s", START_QUIET.as_secs())
                } else {
                    format!("no connection file after {} s", START_CEILING.as_secs())
                };
                return Err(start_failed(ws, language, why));
            }
        }
    };
    let waited = waited.await;
    if waited.is_err() {
        // Whatever failed, nothing is left behind (the branches that
        // ended it already make these no-ops).
        let _ = ws.processes().process_signal(id, "KILL").await;
        let _ = ws.processes().process_remove(id).await;
    }
    waited
}

/// A `language` kernel's (or the kernel server's) start in `ws` failed,
/// for `why`.
pub(crate) fn start_failed(ws: Workspace<'_>, language: CodeLanguage, why: String) -> Error {
    CodeSessionError::Start {
        workspace: ws.name.as_str().to_owned(),
        language: language.as_str(),
        detail: why,
    }
    .into()
}

/// What one poll of a starting kernel (or server) found.
enum Poll<T> {
    /// Its file, whole.
    Written(T),
    /// Its output since the last poll (and whether it runs).
    Output(Box<ProcessOutput>),
}

/// An agent connection the guest left unanswered (see
/// [`guest_agent::client::ClientError::unanswered`]).
fn unanswered_connect(e: &Error) -> bool {
    matches!(e, Error::Agent { source, .. } if source.unanswered())
}

/// Kills background process `process` (when it runs) and removes it from
/// the guest's list.
pub(crate) async fn end_process(ws: Workspace<'_>, process: &str) -> Result<()> {
    let processes = ws.processes();
    let list = processes.process_list().await?;
    let Some(p) = list.iter().find(|p| p.id == process) else {
        return Ok(());
    };
    if p.running() {
        processes.process_signal(process, "KILL").await?;
        processes
            .process_wait(process, Duration::from_secs(30))
            .await?;
    }
    processes.process_remove(process).await
}

/// What the kernel of `language` found missing, by what it said
/// before it ended.
fn missing(language: CodeLanguage, said: &str) -> Option<&'static str> {
    let no_ipykernel = [
        "No module named ipykernel",
        "No module named 'ipykernel'",
        "No module named 'ipykernel.",
    ]
    .iter()
    .any(|missing| said.contains(missing));
    match language {
        CodeLanguage::Python if no_ipykernel => {
            Some("python3 with ipykernel (Debian's python3-ipykernel)")
        }
        CodeLanguage::JavaScript if no_ipykernel || said.contains(javascript::NO_NODE) => {
            Some("node (Debian's nodejs) and python3 with ipykernel (Debian's python3-ipykernel)")
        }
        _ => None,
    }
}

/// Keeps the last 8 KiB of a growing text (on a character boundary).
fn keep_tail(said: &mut String) {
    if said.len() > 16 * 1024 {
        let mut cut = said.len() - 8 * 1024;
        while !said.is_char_boundary(cut) {
            cut += 1;
        }
        said.drain(..cut);
    }
}

/// The JSON in guest file `file` (guest data, bounded), once it is whole:
/// `None` while it is missing or not JSON yet. Only a regular file of
/// `owner` (the uid of the process that writes it) is read: one another
/// guest user put at the name first fails the start.
pub(crate) async fn read_guest_json(
    ws: Workspace<'_>,
    file: &str,
    owner: u32,
) -> Result<Option<Value>> {
    let Some(stat) = ws.files().stat_if_exists(file).await? else {
        return Ok(None);
    };
    if stat.kind != FileKind::File || stat.uid != owner {
        return Err(CodeSessionError::ConnectionFile(format!(
            "{file} is not a file of uid {owner} (uid {}, {:?})",
            stat.uid, stat.kind
        ))
        .into());
    }
    let read = ws
        .files()
        .read_file(file, None, Some(MAX_CONNECTION_FILE))
        .await?;
    Ok(serde_json::from_slice::<Value>(&read.data).ok())
}

/// The uid guest process `pid` runs as.
pub(crate) async fn process_owner(ws: Workspace<'_>, pid: u32) -> Result<u32> {
    Ok(ws.files().stat(&format!("/proc/{pid}")).await?.uid)
}

/// The key and ports of a connection file (`None` while its ports are 0).
pub(crate) fn parse_connection(json: &Value) -> Result<Option<SessionRecord>, CodeSessionError> {
    let bad = |why: &str| CodeSessionError::ConnectionFile(why.to_owned());
    if json["transport"] != "tcp" {
        return Err(bad("its transport is not tcp"));
    }
    if json["signature_scheme"] != "hmac-sha256" {
        return Err(bad("its signature scheme is not hmac-sha256"));
    }
    let key = json["key"].as_str().ok_or_else(|| bad("no key"))?;
    if key.is_empty() || key.len() > 256 {
        return Err(bad("its key is empty or over 256 bytes"));
    }
    let port = |name: &str| -> Result<u16, CodeSessionError> {
        let n = json[name]
            .as_u64()
            .ok_or_else(|| bad(&format!("no {name}")))?;
        u16::try_from(n).map_err(|_| bad(&format!("{name} is not a port")))
    };
    let (shell_port, iopub_port, control_port) = (
        port("shell_port")?,
        port("iopub_port")?,
        port("control_port")?,
    );
    if [shell_port, iopub_port, control_port].contains(&0) {
        return Ok(None);
    }
    Ok(Some(SessionRecord {
        id: String::new(),
        language: CodeLanguage::Python,
        process: None,
        pid: 0,
        started_unix_ms: 0,
        created_unix_ms: 0,
        key: key.to_owned(),
        shell_port,
        iopub_port,
        control_port,
    }))
}

/// A tunnel to guest port `port` through the workspace's agent.
pub(crate) async fn tunnel(ws_dir: &WorkspaceDir, port: u16) -> Result<UnixStream> {
    crate::guest::connect_agent(ws_dir)
        .await
        .map_err(Error::agent("connect"))?
        .tcp_connect(port)
        .await
        .map_err(Error::agent("tcp_connect"))
}

/// A client of `record`'s kernel in the (awake) workspace at `ws_dir`.
pub(crate) async fn connect(
    ws_dir: &WorkspaceDir,
    record: &SessionRecord,
    ready: Duration,
) -> Result<JupyterClient<UnixStream>> {
    let shell = tunnel(ws_dir, record.shell_port).await?;
    let iopub = tunnel(ws_dir, record.iopub_port).await?;
    let control = tunnel(ws_dir, record.control_port).await?;
    let key = record.key.as_bytes();
    let client = JupyterClient::connect(shell, iopub, control, key, ready)
        .await
        .map_err(CodeSessionError::from)?;
    Ok(client)
}

/// Sends `record`'s kernel an interrupt on a connection of its own (for
/// a run whose caller went away).
pub(crate) async fn interrupt(ws_dir: &WorkspaceDir, record: &SessionRecord) -> Result<()> {
    let control = tunnel(ws_dir, record.control_port).await?;
    super::jupyter::send_interrupt(control, record.key.as_bytes())
        .await
        .map_err(CodeSessionError::from)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_a_connection_the_vmm_closed_unanswered_is_polled_again() {
        use guest_agent::client::ClientError;
        let handshake = |reply: &str| Error::Agent {
            op: "connect",
            source: ClientError::Handshake {
                port: 1024,
                reply: reply.into(),
            },
        };
        assert!(unanswered_connect(&handshake("")));
        // A VMM that answered something else is not a busy guest.
        assert!(!unanswered_connect(&handshake("ERR no such port")));
        assert!(!unanswered_connect(&Error::Agent {
            op: "connect",
            source: ClientError::Closed,
        }));
        assert!(!unanswered_connect(&Error::InvalidInput("x".into())));
    }

    #[test]
    fn a_connection_file_is_read_only_when_whole_and_sound() {
        let good = json!({"transport": "tcp", "signature_scheme": "hmac-sha256", "key": "abc",
            "shell_port": 40001, "iopub_port": 40002, "control_port": 40003, "ip": "127.0.0.1"});
        let got = parse_connection(&good).unwrap().unwrap();
        assert_eq!(
            (
                got.key.as_str(),
                got.shell_port,
                got.iopub_port,
                got.control_port
            ),
            ("abc", 40001, 40002, 40003)
        );
        let mut zero = good.clone();
        zero["iopub_port"] = json!(0);
        assert_eq!(parse_connection(&zero).unwrap(), None);
        for (field, value) in [
            ("transport", json!("ipc")),
            ("signature_scheme", json!("hmac-md5")),
            ("key", json!("")),
            ("key", json!("k".repeat(300))),
            ("key", json!(7)),
            ("shell_port", json!(70000)),
            ("shell_port", json!(-1)),
            ("control_port", json!("40003")),
        ] {
            let mut bad = good.clone();
            bad[field] = value;
            assert!(parse_connection(&bad).is_err(), "{field}: {bad}");
        }
        assert!(parse_connection(&json!([])).is_err());
    }

    #[test]
    fn a_kernel_that_ended_for_want_of_its_parts_says_which() {
        let no_ipykernel = "ModuleNotFoundError: No module named 'ipykernel'";
        assert!(missing(CodeLanguage::Python, no_ipykernel).is_some());
        assert!(missing(
            CodeLanguage::Python,
            "/usr/bin/python3: No module named ipykernel_launcher"
        )
        .is_some());
        assert!(missing(CodeLanguage::JavaScript, no_ipykernel).is_some());
        assert!(missing(
            CodeLanguage::JavaScript,
            "microagent: no node on PATH (Debian's nodejs)"
        )
        .is_some());
        assert_eq!(
            missing(CodeLanguage::Python, "microagent: no node on PATH"),
            None
        );
        assert_eq!(
            missing(CodeLanguage::Python, "No module named 'pandas'"),
            None
        );
        for (name, language) in [
            ("python", CodeLanguage::Python),
            ("python3", CodeLanguage::Python),
            ("javascript", CodeLanguage::JavaScript),
            ("js", CodeLanguage::JavaScript),
            ("node", CodeLanguage::JavaScript),
        ] {
            assert_eq!(name.parse::<CodeLanguage>().unwrap(), language);
        }
        assert!("ruby".parse::<CodeLanguage>().is_err());
        assert_eq!(
            serde_json::to_value(CodeLanguage::JavaScript).unwrap(),
            "javascript"
        );
    }
}
