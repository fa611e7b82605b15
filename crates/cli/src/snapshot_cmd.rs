//! `microagent snapshot take | ls | inspect | rm` and `microagent fork`.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Subcommand;
use workspace::{Error, SnapshotInfo, Workspaces};

use crate::output::{self, age};

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot a workspace: its whole machine while it runs (the guest
    /// pauses meanwhile), its disk while it is stopped.
    Take {
        /// Workspace name.
        workspace: String,
        /// Snapshot name (default: WORKSPACE-<unix ms>).
        name: Option<String>,
    },
    /// List snapshots.
    #[command(visible_alias = "list")]
    Ls {
        /// Only snapshots of this workspace.
        #[arg(long)]
        workspace: Option<String>,
    },
    /// Show one snapshot.
    Inspect {
        /// Snapshot name.
        name: String,
    },
    /// Put a snapshot's workspace back to the snapshot's state (a running
    /// one needs --force), or with --as start a new workspace from it.
    Restore {
        /// Snapshot name.
        name: String,
        /// Start a new workspace of this name from the snapshot instead.
        #[arg(long = "as", value_name = "NEW")]
        as_name: Option<String>,
        /// Halt the workspace first if it is running (its state since the
        /// snapshot is lost).
        #[arg(long, short = 'f')]
        force: bool,
        /// Seconds to wait for the agent.
        #[arg(long, value_name = "SECONDS", default_value_t = workspace::DEFAULT_START_TIMEOUT.as_secs())]
        timeout: u64,
    },
    /// Delete a snapshot (workspaces forked from it keep running).
    #[command(visible_aliases = ["remove", "delete"])]
    Rm {
        /// Snapshot name.
        name: String,
    },
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

fn describe(s: &SnapshotInfo) {
    // A snapshot's record may come from a server: escaped.
    println!("{}", output::field(&s.name));
    println!("  workspace   {}", output::field(&s.workspace));
    println!("  image       {}", output::field(&s.spec.image));
    println!(
        "  contents    {}",
        if s.has_memory {
            "memory, devices and disk (resumes where it was taken)"
        } else {
            "disk only (boots from it)"
        }
    );
    println!("  size        {} on disk", mib(s.size_bytes));
    if s.has_memory {
        println!("  paused      {:.1} ms", s.paused_ms);
    }
    for part in &s.services {
        println!(
            "  service     {} ({})",
            output::field(&part.service),
            if part.has_memory {
                "memory and disk"
            } else {
                "disk only"
            }
        );
    }
}

pub async fn run(ws: &Workspaces, cmd: &SnapshotCommand, json: bool) -> Result<ExitCode, Error> {
    match cmd {
        SnapshotCommand::Take { workspace, name } => {
            let began = Instant::now();
            let info = ws.workspace(workspace)?.snapshot_take(name.as_deref())?;
            if json {
                output::json(&info);
            } else {
                eprintln!(
                    "took snapshot {} of {workspace} in {:.0} ms",
                    info.name,
                    began.elapsed().as_secs_f64() * 1000.0
                );
                describe(&info);
            }
        }
        SnapshotCommand::Ls { workspace } => {
            let all = ws.snapshots().list(workspace.as_deref(), true)?;
            if json {
                output::json(&all);
            } else {
                let now = workspace::host::settings::now_ms();
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .map(|s| {
                        vec![
                            s.name.clone(),
                            output::owner(s.spec.agent.as_deref()),
                            s.workspace.clone(),
                            if s.has_memory { "memory+disk" } else { "disk" }.into(),
                            mib(s.size_bytes),
                            age(now.saturating_sub(s.created_at_ms)),
                        ]
                    })
                    .collect();
                output::table(
                    &["NAME", "OWNER", "WORKSPACE", "HOLDS", "SIZE", "AGE"],
                    &rows,
                );
            }
        }
        SnapshotCommand::Inspect { name } => {
            let info = ws.snapshots().get(name)?;
            if json {
                output::json(&info);
            } else {
                describe(&info);
            }
        }
        SnapshotCommand::Restore {
            name,
            as_name,
            force,
            timeout,
        } => {
            let began = Instant::now();
            let show = !json && output::interactive();
            let meta = ws
                .snapshots()
                .restore(
                    name,
                    as_name.as_deref(),
                    *force,
                    Duration::from_secs(*timeout),
                    |p| {
                        if show {
                            eprint!("\r\x1b[2Krestoring {name}: {:>3} s", p.elapsed.as_secs());
                            let _ = std::io::stderr().flush();
                        }
                    },
                )
                .await;
            if show {
                eprint!("\r\x1b[2K");
            }
            let meta = meta?;
            if json {
                output::json(&meta);
            } else {
                eprintln!(
                    "restored {name} as {} ({}) in {:.1} s",
                    meta.name,
                    meta.state,
                    began.elapsed().as_secs_f64()
                );
            }
        }
        SnapshotCommand::Rm { name } => {
            let info = ws.snapshots().delete(name)?;
            if json {
                output::json(&info);
            } else {
                eprintln!("deleted snapshot {}", info.name);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `microagent fork WORKSPACE NEW [--snapshot S]`.
pub async fn fork(
    ws: &Workspaces,
    source: &str,
    new_name: &str,
    snapshot: Option<&str>,
    timeout: Duration,
    json: bool,
) -> Result<ExitCode, Error> {
    let show = !json && output::interactive();
    let began = Instant::now();
    let meta = ws
        .workspace(source)?
        .fork(new_name, snapshot, timeout, |p| {
            if show {
                eprint!("\r\x1b[2Kforking {new_name}: {:>3} s", p.elapsed.as_secs());
                let _ = std::io::stderr().flush();
            }
        })
        .await;
    if show {
        eprint!("\r\x1b[2K");
    }
    let meta = meta?;
    if json {
        output::json(&meta);
    } else {
        eprintln!(
            "forked {new_name} from {} in {:.1} s",
            snapshot.unwrap_or(source),
            began.elapsed().as_secs_f64()
        );
    }
    Ok(ExitCode::SUCCESS)
}
