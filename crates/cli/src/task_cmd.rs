//! `microagent task run | ls | info | logs | wait | rm | slots`, and the
//! hidden `task supervise ID` a task's detached supervisor runs.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use workspace::tasks::TaskInfo;
use workspace::{Error, Workspaces};

use crate::output;

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Run a coding agent's task on an allowlisted repository: a fresh
    /// workspace (warm start) with the repository cloned in, the
    /// description in /workspace/task.md, the repository's task command
    /// run as `user`; its commits are merged back onto the branch
    /// (fast-forward, else rebase; refs/tasks/ID keeps them). Prints the
    /// task id at once; `task wait ID` waits.
    Run {
        /// The allowlisted repository (`repo ls`).
        #[arg(long)]
        repo: String,
        /// The image (default debian; it needs git).
        #[arg(long)]
        image: Option<String>,
        /// The branch to start from and merge onto (default: the
        /// repository's current branch).
        #[arg(long)]
        branch: Option<String>,
        /// A secret the command gets as an environment variable
        /// (repeatable; `secret set NAME` first).
        #[arg(long = "secret", value_name = "NAME")]
        secrets: Vec<String>,
        /// Keep the workspace (stopped) when the task ends.
        #[arg(long)]
        keep: bool,
        /// Refuse instead of queueing when every slot is taken.
        #[arg(long)]
        no_queue: bool,
        /// Guest memory, MiB (default 1024).
        #[arg(long = "mem")]
        mem_mib: Option<u64>,
        /// Wait for the task to end and print how it went.
        #[arg(long)]
        wait: bool,
        /// What to do (the task command reads /workspace/task.md).
        description: String,
    },
    /// List tasks.
    Ls,
    /// Show one task: status, result, merge, timings.
    Info {
        /// The task id.
        id: String,
    },
    /// Show a task's command output (secrets masked).
    Logs {
        /// The task id.
        id: String,
        /// Lines from the end.
        #[arg(short = 'l', long, default_value_t = 100)]
        lines: usize,
        /// Keep printing as the task writes, until it ends.
        #[arg(short, long)]
        follow: bool,
    },
    /// Wait for a task to end (or, without an id, for the next task to end
    /// that nobody was told of yet).
    Wait {
        /// The task id.
        id: Option<String>,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
    },
    /// Remove an ended task's record, logs and kept workspace (refs/tasks/ID
    /// stays unless --delete-ref). --force cancels a running one first:
    /// its workspace stops, what it committed stays at refs/tasks/ID.
    Rm {
        /// The task id.
        id: String,
        /// Cancel it first if it still runs.
        #[arg(long)]
        force: bool,
        /// Delete refs/tasks/ID from the repository too.
        #[arg(long)]
        delete_ref: bool,
    },
    /// The task slots and the tasks holding them.
    Slots,
    /// Drive a task to its end (started detached by `task run`).
    #[command(hide = true)]
    Supervise {
        /// The task id.
        id: String,
    },
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

fn status(t: &TaskInfo) -> String {
    t.status.as_str().to_owned()
}

fn describe(t: &TaskInfo) {
    println!("task:      {}", t.task_id);
    println!("status:    {}", status(t));
    println!(
        "repo:      {} (branch {} at {})",
        t.repo,
        t.branch,
        short(&t.base)
    );
    println!("workspace: {}", t.workspace);
    if let Some(slot) = t.slot {
        println!("slot:      {slot}");
    }
    if let Some(code) = t.exit_code {
        println!("exit code: {code}");
    }
    if let Some(r) = &t.result {
        println!(
            "result:    {}{}",
            if r.success { "success" } else { "failure" },
            r.summary
                .as_deref()
                .map(|s| format!(": {s}"))
                .unwrap_or_default()
        );
    }
    if let Some(m) = &t.merge_result {
        let how = match (m.merged, m.method) {
            (true, Some(method)) => format!("merged ({method:?}) "),
            _ => "not merged ".into(),
        };
        println!(
            "merge:     {how}{} commit(s), kept at {}{}",
            m.commits,
            m.task_ref,
            m.reason
                .as_deref()
                .map(|r| format!("; {r}"))
                .unwrap_or_default()
        );
        if !m.conflicts.is_empty() {
            println!("conflicts: {}", m.conflicts.join(", "));
        }
    }
    if let Some(e) = &t.error {
        println!("error:     {e}");
    }
}

pub async fn run(ws: &Workspaces, cmd: &TaskCommand, json: bool) -> Result<ExitCode, Error> {
    match cmd {
        TaskCommand::Run {
            repo,
            image,
            branch,
            secrets,
            keep,
            no_queue,
            mem_mib,
            wait,
            description,
        } => {
            let mut req = workspace::tasks::TaskRequest::new(description, repo);
            req.image = image.clone();
            req.branch = branch.clone();
            req.secrets = secrets.clone();
            req.keep = *keep;
            req.no_queue = *no_queue;
            req.mem_mib = *mem_mib;
            let mut info = ws.run_task(&req)?;
            if *wait {
                info = ws.wait_task(&info.task_id, Duration::MAX).await?;
            }
            if json {
                output::json(&info);
            } else if *wait {
                describe(&info);
            } else {
                println!(
                    "task {} is {} (slot {}); `microagent task wait {}` waits, `task logs {} -f` follows it",
                    info.task_id,
                    status(&info),
                    info.slot.map_or("queued".into(), |s| s.to_string()),
                    info.task_id,
                    info.task_id
                );
            }
        }
        TaskCommand::Ls => {
            let all = ws.list_tasks(true)?;
            if json {
                output::json(&all);
            } else {
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .map(|t| {
                        vec![
                            t.task_id.clone(),
                            output::owner(t.agent.as_deref()),
                            status(t),
                            t.repo.clone(),
                            t.branch.clone(),
                            t.merge_result.as_ref().map_or("-".into(), |m| {
                                if m.merged { "merged" } else { "not merged" }.into()
                            }),
                            t.description
                                .lines()
                                .next()
                                .unwrap_or("")
                                .chars()
                                .take(40)
                                .collect(),
                        ]
                    })
                    .collect();
                output::table(
                    &[
                        "TASK",
                        "OWNER",
                        "STATUS",
                        "REPO",
                        "BRANCH",
                        "MERGE",
                        "DESCRIPTION",
                    ],
                    &rows,
                );
            }
        }
        TaskCommand::Info { id } => {
            let info = ws.task_info(id)?;
            if json {
                output::json(&info);
            } else {
                describe(&info);
            }
        }
        TaskCommand::Logs { id, lines, follow } => {
            let logs = ws.task_logs(id, *lines)?;
            if json && !follow {
                output::json(&logs);
                return Ok(ExitCode::SUCCESS);
            }
            if !logs.tail.is_empty() {
                println!("{}", logs.tail);
            }
            if *follow {
                follow_log(ws, id, &logs.path).await?;
            }
        }
        TaskCommand::Wait { id, timeout } => {
            let timeout = Duration::from_secs(*timeout);
            let info = match id {
                Some(id) => Some(ws.wait_task(id, timeout).await?),
                None => ws.wait_next_task_event(timeout).await?,
            };
            match (info, json) {
                (Some(info), true) => output::json(&info),
                (Some(info), false) => describe(&info),
                (None, true) => output::json(&serde_json::json!({ "timeout": true })),
                (None, false) => println!("no task ended within {} s", timeout.as_secs()),
            }
        }
        TaskCommand::Rm {
            id,
            force,
            delete_ref,
        } => {
            if *force && !ws.task_info(id)?.status.is_final() {
                ws.cancel_task(id).await?;
                ws.wait_task(id, Duration::from_secs(300)).await?;
            }
            let info = ws.cleanup_task(id, *delete_ref)?;
            if json {
                output::json(
                    &serde_json::json!({ "removed": info.task_id, "ref_deleted": delete_ref }),
                );
            } else {
                println!("removed task {}", info.task_id);
            }
        }
        TaskCommand::Slots => {
            let slots = ws.task_slots()?;
            if json {
                output::json(&slots);
            } else {
                println!(
                    "{} slot(s), {} free",
                    slots.max_slots,
                    slots.available.len()
                );
                for a in &slots.active {
                    println!("slot {}: task {} ({})", a.slot, a.task_id, a.repo);
                }
                for c in &slots.caches {
                    println!("{}", c.line());
                }
            }
        }
        TaskCommand::Supervise { id } => {
            let info = ws.supervise_task(id).await?;
            eprintln!("task {id} ended: {:?}", info.status);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints what the log gains until the task ends, reading only the new
/// bytes each time.
async fn follow_log(ws: &Workspaces, id: &str, path: &std::path::Path) -> Result<(), Error> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut offset = std::fs::metadata(path).map_or(0, |m| m.len());
    loop {
        let ended = ws.task_info(id)?.status.is_final();
        if let Ok(mut file) = std::fs::File::open(path) {
            let mut new = Vec::new();
            if file.seek(SeekFrom::Start(offset)).is_ok() && file.read_to_end(&mut new).is_ok() {
                offset += new.len() as u64;
                let mut out = std::io::stdout();
                let _ = out.write_all(&new);
                let _ = out.flush();
            }
        }
        if ended {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
