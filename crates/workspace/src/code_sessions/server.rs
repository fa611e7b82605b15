//! The kernel server in a workspace (`kernels/kernel_server.py`): one
//! Python process, background process [`PROCESS`], that imported
//! ipykernel once and forks each kernel, so a kernel's start is its own
//! set-up (some 400 system calls and 3,700 page faults natively) instead
//! of ipykernel's imports (11,000 and 9,800), which cost minutes where
//! guest kernel mode is emulated. It is started with a workspace's first
//! kernel and kept in the image's warm snapshot by `code prepare`.
//!
//! A kernel is asked for over the agent's `tcp_connect` to the port the
//! server wrote in [`PORT_FILE`] (guest data: bounded and checked), with
//! the key written beside it, naming the launcher: the background
//! process the host started for the kernel ([`LAUNCHER`]), whose group
//! the kernel joins and whose output it takes, so the agent's signals
//! and output reach the kernel and the two end together.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::javascript;
use super::launch;
use super::records::SessionRecord;
use super::{CodeLanguage, CodeSessionError};
use crate::error::{Error, Result};
use crate::guest::processes::ProcessOptions;
use crate::guest::request::ExecRequest;
use crate::workspaces::handle::Workspace;
use base::store::workspace_dir::WorkspaceDir;

/// The server, run as `python3 -c SERVER PORT_FILE`.
pub const SERVER: &str = include_str!("kernels/kernel_server.py");
/// Its background process.
pub(crate) const PROCESS: &str = "code-kernels";
/// Where it writes its port and key (0600, as the workspace's user).
const PORT_FILE: &str = "/tmp/.microagent-code-kernels.json";
/// A kernel's launcher: it holds the kernel's process group and output
/// until the server kills it when the kernel ends; SIGINT (an interrupt
/// sent to the process) reaches the kernel without ending it.
pub const LAUNCHER: &str = "trap '' INT; exec sleep infinity";
/// Longest reply read from the server.
const MAX_REPLY: u64 = 4096;
/// How long the server may take to fork and answer (a fork of a process
/// of ~100 MiB is page-table work of the emulated guest kernel).
const REPLY_TIMEOUT: Duration = Duration::from_secs(300);

/// Starts a kernel as background process `process` (its connection file
/// named with `nonce`): a launcher the workspace's kernel server
/// (started when none runs) forks a kernel into; then waits,
/// at most `launch::START_CEILING` while it works, for its connection file.
/// The record's id is the process's.
pub(crate) async fn start(
    ws: Workspace<'_>,
    process: &str,
    nonce: &str,
    language: CodeLanguage,
) -> Result<SessionRecord> {
    let id = process;
    let file = launch::connection_file(id, nonce);
    let address = ensure(ws, language).await?;
    let mut argv = Vec::new();
    let mut env = vec![("PYTHONUNBUFFERED", "1".to_owned())];
    if language == CodeLanguage::JavaScript {
        let (kernel, runner) = javascript::paths(id, nonce);
        javascript::install(ws, &kernel, &runner).await?;
        argv.push(kernel);
        env.push((javascript::RUNNER_VAR, runner));
    }
    argv.extend([
        "-f".to_owned(),
        file.clone(),
        launch::KERNEL_IP_ARG.to_owned(),
    ]);
    let options = ProcessOptions {
        id: Some(id.to_owned()),
        ..ProcessOptions::default()
    };
    // A process of this id left by an ended session (the guest keeps
    // finished ones for their output): ours replaces it.
    launch::end_process(ws, id).await?;
    let launcher = ExecRequest::argv(["sh", "-c", LAUNCHER]);
    let info = ws.processes().process_start(launcher, options).await?;
    let ws_dir = ws.all.dir(ws.name.as_str())?;
    let forked = async {
        fork(ws, &ws_dir, &address, info.pid, language, &argv, &env).await?;
        launch::wait_for(ws, id, info.pid, language, &file, |json, _| {
            launch::parse_connection(json)
        })
        .await
    };
    match forked.await {
        Ok(record) => Ok(SessionRecord {
            id: id.to_owned(),
            language,
            pid: info.pid,
            started_unix_ms: info.started_unix_ms,
            created_unix_ms: base::host::settings::now_ms(),
            ..record
        }),
        Err(e) => {
            // No launcher (nor its kernel) is left behind.
            let _ = launch::end_process(ws, id).await;
            Err(e)
        }
    }
}

/// Where the server listens, and the key it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerAddress {
    pub port: u16,
    pub key: String,
}

/// The workspace's kernel server, started (and waited for: minutes the
/// first time) when none runs.
pub(crate) async fn ensure(ws: Workspace<'_>, language: CodeLanguage) -> Result<ServerAddress> {
    let list = ws.processes().process_list().await?;
    if let Some(running) = list.iter().find(|p| p.id == PROCESS && p.running()) {
        let owner = launch::process_owner(ws, running.pid).await?;
        match launch::read_guest_json(ws, PORT_FILE, owner).await {
            Ok(Some(json)) => {
                if let Ok(Some(address)) = parse_port_file(&json, running.pid) {
                    return Ok(address);
                }
            }
            // Still importing (a start whose caller went away left it):
            // its import is waited for, not begun again.
            Ok(None) => {
                return launch::wait_for(
                    ws,
                    PROCESS,
                    running.pid,
                    language,
                    PORT_FILE,
                    parse_port_file,
                )
                .await;
            }
            Err(_) => {}
        }
    }
    // None, ended, or with a port file not its own: a new one.
    launch::end_process(ws, PROCESS).await?;
    ws.files().remove(PORT_FILE, false, false).await.ok();
    let req = ExecRequest::argv(["python3", "-c", SERVER, PORT_FILE]).env("PYTHONUNBUFFERED", "1");
    let options = ProcessOptions {
        id: Some(PROCESS.to_owned()),
        ..ProcessOptions::default()
    };
    let info = ws.processes().process_start(req, options).await?;
    launch::wait_for(ws, PROCESS, info.pid, language, PORT_FILE, parse_port_file).await
}

/// Asks the server at `address` for a kernel of `language` run with
/// `argv` (ipykernel's arguments, or the JavaScript kernel's file and
/// its arguments) and `env`, in launcher `launcher`'s group.
pub(crate) async fn fork(
    ws: Workspace<'_>,
    ws_dir: &WorkspaceDir,
    address: &ServerAddress,
    launcher: u32,
    language: CodeLanguage,
    argv: &[String],
    env: &[(&str, String)],
) -> Result<()> {
    let request = json!({
        "key": address.key,
        "launcher": launcher,
        "language": language.as_str(),
        "argv": argv,
        "env": env.iter().map(|(k, v)| ((*k).to_owned(), Value::from(v.as_str()))).collect::<serde_json::Map<_, _>>(),
    });
    let refused = |why: String| launch::start_failed(ws, language, why);
    let asked = async {
        let mut stream = launch::tunnel(ws_dir, address.port).await?;
        let mut line = request.to_string();
        line.push('\n');
        stream
            .write_all(line.as_bytes())
            .await
            .map_err(|e| refused(format!("the kernel server took no request: {e}")))?;
        let mut reply = Vec::new();
        BufReader::new(tokio::io::AsyncReadExt::take(stream, MAX_REPLY))
            .read_until(b'\n', &mut reply)
            .await
            .map_err(|e| refused(format!("the kernel server did not answer: {e}")))?;
        Ok::<_, Error>(reply)
    };
    let reply = tokio::time::timeout(REPLY_TIMEOUT, asked)
        .await
        .map_err(|_| {
            refused(format!(
                "the kernel server did not answer in {} s",
                REPLY_TIMEOUT.as_secs()
            ))
        })??;
    parse_reply(&reply).map_err(refused)
}

/// The port and key of server `pid` from its port file (`None` until
/// whole).
fn parse_port_file(json: &Value, pid: u32) -> Result<Option<ServerAddress>, CodeSessionError> {
    let bad = |why: &str| CodeSessionError::ConnectionFile(format!("the kernel server's {why}"));
    let Some(port) = json.get("port") else {
        return Ok(None);
    };
    if json.get("pid").and_then(Value::as_u64) != Some(u64::from(pid)) {
        return Err(bad("port file names another process"));
    }
    let port = port
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p != 0)
        .ok_or_else(|| bad("port is not a port"))?;
    let key = json["key"].as_str().ok_or_else(|| bad("key is missing"))?;
    if key.is_empty() || key.len() > 256 {
        return Err(bad("key is empty or over 256 bytes"));
    }
    Ok(Some(ServerAddress {
        port,
        key: key.to_owned(),
    }))
}

/// What the server answered: `Ok` for a kernel forked, else why not (its
/// words cut short: guest data).
fn parse_reply(reply: &[u8]) -> Result<(), String> {
    let json: Value = serde_json::from_slice(reply)
        .map_err(|_| "the kernel server's answer is not JSON".to_owned())?;
    if json.get("pid").and_then(Value::as_u64).is_some() {
        return Ok(());
    }
    let why: String = json
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("no pid")
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    Err(format!("the kernel server refused: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_file_is_read_only_when_whole_and_sound() {
        let good = json!({"port": 40111, "key": "k1", "pid": 7});
        assert_eq!(
            parse_port_file(&good, 7).unwrap(),
            Some(ServerAddress {
                port: 40111,
                key: "k1".into()
            })
        );
        assert_eq!(parse_port_file(&json!({}), 7).unwrap(), None);
        // Another server's (or one a guest user wrote): not ours.
        assert!(parse_port_file(&good, 8).is_err());
        assert!(parse_port_file(&json!({"port": 40111, "key": "k1"}), 7).is_err());
        for bad in [
            json!({"port": 0, "key": "k", "pid": 7}),
            json!({"port": 70000, "key": "k", "pid": 7}),
            json!({"port": "1", "key": "k", "pid": 7}),
            json!({"port": 1, "pid": 7}),
            json!({"port": 1, "key": "", "pid": 7}),
            json!({"port": 1, "key": "k".repeat(257), "pid": 7}),
        ] {
            assert!(parse_port_file(&bad, 7).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_reply_is_a_pid_or_a_refusal_cut_short() {
        assert_eq!(parse_reply(b"{\"pid\": 12}\n"), Ok(()));
        let refused = parse_reply(b"{\"error\": \"wrong key\"}\n").unwrap_err();
        assert!(refused.ends_with("wrong key"), "{refused}");
        let long = format!("{{\"error\": \"{}\\u001b[2J\"}}", "x".repeat(5000));
        let cut = parse_reply(long.as_bytes()).unwrap_err();
        assert!(cut.len() < 300 && !cut.contains('\u{1b}'), "{cut}");
        assert!(parse_reply(b"").is_err());
        assert!(parse_reply(b"{\"pid\": \"12\"}").is_err());
        assert!(parse_reply(b"[1]").is_err());
    }
}
