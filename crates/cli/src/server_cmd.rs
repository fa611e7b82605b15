//! `microagent server add | ls | status | rm`: the hosts this one reaches
//! over SSH (docs/servers.md).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use workspace::servers::{Availability, ServerReport, ServerSpec, ServerStatus};
use workspace::Workspaces;

use crate::output;

#[derive(Debug, Subcommand)]
pub enum ServerCommand {
    /// Add a server: a host with microagent, reached with the system's
    /// ssh (your ~/.ssh/config, agent and known_hosts apply; never a
    /// password prompt).
    Add {
        /// Its name (lowercase letters, digits and '-').
        name: String,
        /// USER@HOST or USER@HOST:PORT.
        #[arg(long)]
        ssh: String,
        /// The private key to log in with.
        #[arg(long, value_name = "FILE")]
        identity: Option<PathBuf>,
        /// Its state directory (MICROAGENT_HOME there).
        #[arg(long, value_name = "PATH")]
        state_dir: Option<String>,
        /// The microagent to run there (default: the one on its PATH).
        #[arg(long, value_name = "PATH")]
        remote_binary: Option<String>,
        /// An extra `ssh -o` option, Key=Value (repeatable).
        #[arg(long = "ssh-option", value_name = "KEY=VALUE")]
        ssh_options: Vec<String>,
    },
    /// List the servers, `local` first, with health and resources.
    #[command(visible_alias = "list")]
    Ls,
    /// One server's health, resources and workspaces.
    Status {
        /// Server name (`local`: this host).
        name: String,
        /// Also what each workspace uses now: CPU, memory, disk, network
        /// (its guest sampled, at most 10 s).
        #[arg(long)]
        usage: bool,
    },
    /// Remove a server (refused while workspaces live on it).
    #[command(visible_aliases = ["remove", "delete"])]
    Rm {
        /// Server name.
        name: String,
    },
}

pub async fn run(ws: &Workspaces, cmd: &ServerCommand, json: bool) -> workspace::Result<ExitCode> {
    match cmd {
        ServerCommand::Add {
            name,
            ssh,
            identity,
            state_dir,
            remote_binary,
            ssh_options,
        } => {
            let mut spec = ServerSpec::new(name, ssh);
            if let Some(file) = identity {
                spec = spec.identity(absolute(file));
            }
            if let Some(dir) = state_dir {
                spec = spec.state_dir(dir);
            }
            if let Some(bin) = remote_binary {
                spec = spec.remote_binary(bin);
            }
            for option in ssh_options {
                spec = spec.ssh_option(option);
            }
            ws.servers().add(&spec)?;
            let report = ws.server_pool().server_report(name, false).await?;
            if json {
                output::json(&report.server);
            } else {
                println!("server {name} added");
                print_statuses(&[report.server]);
            }
        }
        ServerCommand::Ls => {
            let statuses: Vec<ServerStatus> = ws
                .server_pool()
                .server_reports()
                .await?
                .into_iter()
                .map(|r| r.server)
                .collect();
            if json {
                output::json(&statuses);
            } else {
                print_statuses(&statuses);
            }
        }
        ServerCommand::Status { name, usage } => {
            let report = ws.server_pool().server_report(name, *usage).await?;
            if json {
                output::json(&report);
            } else {
                print_report(&report);
            }
        }
        ServerCommand::Rm { name } => {
            let spec = ws.servers().remove(name)?;
            if json {
                output::json(&spec);
            } else {
                println!("server {name} removed");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn absolute(file: &std::path::Path) -> PathBuf {
    std::path::absolute(file).unwrap_or_else(|_| file.to_owned())
}

fn gib(bytes: u64) -> String {
    format!("{:.1}G", bytes as f64 / f64::from(1u32 << 30))
}

fn print_statuses(statuses: &[ServerStatus]) {
    let rows: Vec<Vec<String>> = statuses
        .iter()
        .map(|s| {
            let status = match s.status {
                Availability::Online => "online",
                Availability::Degraded => "degraded",
                Availability::Offline => "offline",
            };
            let host = s.host.clone().unwrap_or_else(|| "-".into());
            let mut row = vec![s.name.clone(), host, status.to_owned()];
            match &s.resources {
                Some(r) => row.extend([
                    r.total_cpus.to_string(),
                    format!("{:.0}%", r.cpu_used_percent),
                    format!("{}/{}", gib(r.used_memory_bytes), gib(r.total_memory_bytes)),
                    format!("{}/{}", gib(r.used_disk_bytes), gib(r.total_disk_bytes)),
                    r.running_workspaces.to_string(),
                    r.available_score.to_string(),
                ]),
                None => row.extend(std::iter::repeat_n("-".to_owned(), 6)),
            }
            row.push(s.reason.clone().unwrap_or_default());
            row
        })
        .collect();
    output::table(
        &[
            "NAME", "HOST", "STATUS", "CPUS", "CPU", "MEMORY", "DISK", "RUNNING", "SCORE", "REASON",
        ],
        &rows,
    );
}

fn print_report(report: &ServerReport) {
    print_statuses(std::slice::from_ref(&report.server));
    if let Some(h) = &report.server.health {
        // What the remote machine answered.
        let health = format!(
            "ssh {}, kvm {}, microagent {}, doctor {}",
            h.ssh, h.kvm, h.microagent, h.doctor
        );
        println!("\nhealth: {}", output::field(&health));
    }
    if report.workspaces.is_empty() {
        return;
    }
    println!();
    let rows: Vec<Vec<String>> = report
        .workspaces
        .iter()
        .map(|w| {
            vec![
                w.name.clone(),
                w.state.clone(),
                w.image.clone(),
                w.vcpus.to_string(),
                format!("{} MiB", w.mem_mib),
                figure(w, |f| f.cpu_percent.map(|c| format!("{c:.0}%"))),
                figure(w, |f| f.memory_used_bytes.map(mib)),
                figure(w, |f| f.disk_used_bytes.map(mib)),
                figure(w, |f| {
                    let (rx, tx) = (f.net_rx_bytes?, f.net_tx_bytes?);
                    Some(format!("{}/{}", mib(rx), mib(tx)))
                }),
            ]
        })
        .collect();
    output::table(
        &[
            "WORKSPACE",
            "STATE",
            "IMAGE",
            "VCPUS",
            "MEMORY",
            "CPU",
            "MEM USED",
            "DISK USED",
            "NET RX/TX",
        ],
        &rows,
    );
}

/// One of a workspace's figures, `-` when it has none.
fn figure(
    w: &workspace::servers::WorkspaceUsage,
    pick: impl Fn(&workspace::servers::WorkspaceFigures) -> Option<String>,
) -> String {
    w.usage
        .as_ref()
        .and_then(pick)
        .unwrap_or_else(|| "-".into())
}

fn mib(bytes: u64) -> String {
    format!("{}M", bytes >> 20)
}

/// Answers one workspace call read from stdin (what a host that placed a
/// workspace here sends over ssh): the call is its first line, and what
/// follows is the call's own input (a command's stdin). Frames (a
/// command's output as it comes) go to stdout before the answer, JSON.
pub async fn answer_call(ws: &Workspaces) -> workspace::Result<ExitCode> {
    use std::io::{BufRead, Read, Write};
    use workspace::servers::MAX_CALL_BYTES;
    let mut body = Vec::new();
    let mut stdin = std::io::stdin().lock();
    (&mut stdin)
        .take(MAX_CALL_BYTES as u64 + 1)
        .read_until(b'\n', &mut body)
        .map_err(|e| workspace::Error::InvalidInput(format!("reading the call from stdin: {e}")))?;
    drop(stdin);
    if body.len() > MAX_CALL_BYTES {
        return Err(workspace::Error::InvalidInput(format!(
            "a workspace call of more than {MAX_CALL_BYTES} bytes"
        )));
    }
    let call: workspace::servers::RemoteCall = serde_json::from_slice(&body)
        .map_err(|e| workspace::Error::InvalidInput(format!("not a workspace call: {e}")))?;
    let mut frames = |frame: workspace::servers::CallFrame| {
        let mut out = std::io::stdout().lock();
        out.write_all(&frame.to_line())
            .and_then(|()| out.flush())
            .is_ok()
    };
    let streams = workspace::servers::CallStreams {
        stdin: rest_of_stdin(),
        frames: &mut frames,
    };
    output::json(&ws.server_pool().answer_call(call, streams).await?);
    Ok(ExitCode::SUCCESS)
}

/// The rest of stdin, chunk by chunk, read on a thread of its own: one
/// that still waits for input when the answer is out does not keep this
/// process from exiting (a runtime's blocking read would).
fn rest_of_stdin() -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    use std::io::Read;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match std::io::stdin().lock().read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}
