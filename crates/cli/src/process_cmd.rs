//! Background processes: `exec --detach`, `ps WS`, and `process output |
//! wait | signal | stdin | rm WS ID`.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Subcommand;
use serde::Serialize;
use workspace::{
    guest::ProcessOptions, guest::ProcessOutput, Error, ErrorCode, ProcessInfo, Workspaces,
};

use crate::exec_cmd::ExecArgs;
use crate::output;

/// Each long poll of `process output --follow` (the agent answers at once
/// when output comes).
const FOLLOW_POLL: Duration = Duration::from_secs(30);

#[derive(Debug, Subcommand)]
pub enum ProcessCommand {
    /// A process's output from byte cursors (0: from the start); the next
    /// cursors go to stderr (or into --json). `--follow` streams until it
    /// ends.
    Output {
        /// Workspace name.
        workspace: String,
        /// Process id (from `exec --detach` or `ps`).
        id: String,
        /// First stdout byte wanted.
        #[arg(long, default_value_t = 0)]
        stdout_cursor: u64,
        /// First stderr byte wanted.
        #[arg(long, default_value_t = 0)]
        stderr_cursor: u64,
        /// Wait up to this many seconds for output when there is none yet.
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        wait: u64,
        /// Keep printing output until the process ends and its output closes.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Wait for a process to end; exits with its status (124 if its
    /// timeout killed it), or fails with TIMEOUT while it still runs.
    Wait {
        /// Workspace name.
        workspace: String,
        /// Process id.
        id: String,
        /// Seconds to wait.
        #[arg(long, value_name = "SECONDS", default_value_t = 600)]
        timeout: u64,
    },
    /// Send a signal to a process's process group.
    Signal {
        /// Workspace name.
        workspace: String,
        /// Process id.
        id: String,
        /// Signal name or number (TERM, KILL, INT, 9, ...).
        #[arg(default_value = "TERM")]
        signal: String,
    },
    /// Write to a process's stdin (started with `exec --detach -i`): DATA,
    /// or this command's own stdin when DATA is absent.
    Stdin {
        /// Workspace name.
        workspace: String,
        /// Process id.
        id: String,
        /// Text to write (a newline is not added).
        data: Option<String>,
        /// Close the process's stdin afterwards (end of file).
        #[arg(long)]
        close: bool,
    },
    /// Forget a finished process and its output.
    #[command(visible_aliases = ["remove", "delete"])]
    Rm {
        /// Workspace name.
        workspace: String,
        /// Process id.
        id: String,
    },
}

/// `exec --detach`: starts the command and prints its process id.
pub async fn detach(
    ws: &Workspaces,
    name: &str,
    args: &ExecArgs,
    json: bool,
) -> Result<ExitCode, Error> {
    let cmd = &args.command;
    // The output cap of a detached command is its ring size.
    let req = cmd.request(&args.env)?;
    let options = ProcessOptions {
        stdin: cmd.stdin,
        ring_bytes: cmd.output_cap,
        id: None,
    };
    let info = ws
        .workspace(name)?
        .processes()
        .process_start(req, options)
        .await?;
    if json {
        output::json(&info);
    } else {
        // The id comes from the guest's agent (or a server).
        let id = output::field(&info.id);
        println!("{id}");
        if output::interactive() {
            eprintln!(
                "microagent: started {id} (pid {}); `microagent process output {name} {id} --follow` shows its output",
                info.pid
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `ps WS`.
pub async fn ps(ws: &Workspaces, name: &str, json: bool) -> Result<ExitCode, Error> {
    let list = ws.workspace(name)?.processes().process_list().await?;
    if json {
        #[derive(Serialize)]
        struct Listed<'a> {
            workspace: &'a str,
            processes: &'a [ProcessInfo],
        }
        output::json(&Listed {
            workspace: name,
            processes: &list,
        });
        return Ok(ExitCode::SUCCESS);
    }
    let now = now_ms();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|p| {
            vec![
                p.id.clone(),
                p.pid.to_string(),
                p.status(),
                output::age(now.saturating_sub(p.started_unix_ms)),
                format!("{}/{}", p.stdout_bytes, p.stderr_bytes),
                p.command.clone(),
            ]
        })
        .collect();
    output::table(
        &["ID", "PID", "STATUS", "STARTED", "OUT/ERR", "COMMAND"],
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}

/// What `process output --json` prints per read.
#[derive(Serialize)]
struct OutputJson<'a> {
    process: &'a ProcessInfo,
    stdout: String,
    stderr: String,
    stdout_cursor: u64,
    stderr_cursor: u64,
    stdout_dropped: u64,
    stderr_dropped: u64,
    eof: bool,
}

fn print_output(out: &ProcessOutput, json: bool) {
    if json {
        output::json(&OutputJson {
            process: &out.process,
            stdout: String::from_utf8_lossy(&out.stdout.bytes).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr.bytes).into_owned(),
            stdout_cursor: out.stdout.next_cursor,
            stderr_cursor: out.stderr.next_cursor,
            stdout_dropped: out.stdout.dropped,
            stderr_dropped: out.stderr.dropped,
            eof: out.eof,
        });
        return;
    }
    for (what, dropped) in [
        ("stdout", out.stdout.dropped),
        ("stderr", out.stderr.dropped),
    ] {
        if dropped > 0 {
            eprintln!("microagent: {dropped} bytes of {what} were no longer kept (the process's output ring overflowed)");
        }
    }
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(&out.stdout.bytes).and_then(|()| o.flush());
    let _ = std::io::stderr().write_all(&out.stderr.bytes);
}

async fn output_cmd(
    ws: &Workspaces,
    name: &str,
    id: &str,
    mut cursors: [u64; 2],
    wait: u64,
    follow: bool,
    json: bool,
) -> Result<ExitCode, Error> {
    let mut wait = Duration::from_secs(wait);
    loop {
        let out = ws
            .workspace(name)?
            .processes()
            .process_output(id, cursors, None, wait)
            .await?;
        print_output(&out, json);
        cursors = [out.stdout.next_cursor, out.stderr.next_cursor];
        if !follow {
            if !json {
                eprintln!(
                    "microagent: {} ({}); next: --stdout-cursor {} --stderr-cursor {}",
                    id,
                    out.process.status(),
                    cursors[0],
                    cursors[1]
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        if out.finished() {
            return Ok(ExitCode::from(wait_status(&out.process)));
        }
        wait = FOLLOW_POLL;
    }
}

/// `logs NAME --service SERVICE [-f]`: the service's command's output, as
/// `process output` prints a process's.
pub async fn service_logs(
    ws: &Workspaces,
    name: &str,
    service: &str,
    follow: bool,
    json: bool,
) -> Result<ExitCode, Error> {
    let mut cursors = [0, 0];
    loop {
        let wait = if follow { FOLLOW_POLL } else { Duration::ZERO };
        let out = ws
            .workspace(name)?
            .service_output(service, cursors, wait)
            .await?;
        if json {
            print_output(&out, json);
        } else {
            // A service's image is outside data: on a terminal its bytes
            // cannot drive it, as the console's cannot (`logs`).
            use std::io::IsTerminal;
            print!(
                "{}",
                output::guest_text(&String::from_utf8_lossy(&out.stdout.bytes))
            );
            let stderr = String::from_utf8_lossy(&out.stderr.bytes);
            if std::io::stderr().is_terminal() {
                eprint!("{}", output::inert(&stderr));
            } else {
                eprint!("{stderr}");
            }
        }
        cursors = [out.stdout.next_cursor, out.stderr.next_cursor];
        if !follow || out.finished() {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// The exit status that stands for how a finished process ended.
fn wait_status(p: &ProcessInfo) -> u8 {
    crate::exec_cmd::status_of(p.timed_out, p.exit_code, p.signal, output::FAILURE)
}

pub async fn run(ws: &Workspaces, cmd: &ProcessCommand, json: bool) -> Result<ExitCode, Error> {
    match cmd {
        ProcessCommand::Output {
            workspace,
            id,
            stdout_cursor,
            stderr_cursor,
            wait,
            follow,
        } => {
            let cursors = [*stdout_cursor, *stderr_cursor];
            output_cmd(ws, workspace, id, cursors, *wait, *follow, json).await
        }
        ProcessCommand::Wait {
            workspace,
            id,
            timeout,
        } => {
            let info = ws
                .workspace(workspace)?
                .processes()
                .process_wait(id, Duration::from_secs(*timeout))
                .await?;
            if info.running() {
                let message = format!(
                    "process {id} still runs after {timeout} s; wait again, or end it with `microagent process signal {workspace} {id} TERM`"
                );
                return Ok(output::report(
                    ErrorCode::Timeout,
                    &message,
                    json,
                    output::FAILURE,
                ));
            }
            if json {
                output::json(&info);
            } else if output::interactive() {
                eprintln!("microagent: {id} {}", info.status());
            }
            Ok(ExitCode::from(wait_status(&info)))
        }
        ProcessCommand::Signal {
            workspace,
            id,
            signal,
        } => {
            ws.workspace(workspace)?
                .processes()
                .process_signal(id, signal)
                .await?;
            if json {
                output::json(&serde_json::json!({ "id": id, "signal": signal }));
            }
            Ok(ExitCode::SUCCESS)
        }
        ProcessCommand::Stdin {
            workspace,
            id,
            data,
            close,
        } => {
            let bytes = match data {
                Some(text) => text.clone().into_bytes(),
                None => {
                    let mut buf = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut buf)
                        .map_err(|source| Error::HostIo {
                            what: "reading this command's stdin".into(),
                            source,
                        })?;
                    buf
                }
            };
            let written = ws
                .workspace(workspace)?
                .processes()
                .process_write_stdin(id, &bytes, *close)
                .await?;
            if json {
                output::json(&serde_json::json!({ "id": id, "bytes": written, "closed": close }));
            }
            Ok(ExitCode::SUCCESS)
        }
        ProcessCommand::Rm { workspace, id } => {
            ws.workspace(workspace)?
                .processes()
                .process_remove(id)
                .await?;
            if json {
                output::json(&serde_json::json!({ "id": id, "removed": true }));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
