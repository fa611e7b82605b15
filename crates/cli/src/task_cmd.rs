//! `microagent task run | ls | info | logs | wait | rm | slots`, and the
//! hidden `task supervise ID` a task's detached supervisor runs.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use workspace::tasks::log::{LogRange, MAX_LOG_READ};
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
        /// Guest memory, MiB or with a unit (`2g`; default config.json's
        /// task.mem_mib, else 1024).
        #[arg(long = "mem", value_parser = crate::output::mib)]
        mem_mib: Option<u64>,
        /// Wait for the task to end and print how it went.
        #[arg(long)]
        wait: bool,
        /// What to do (the task command reads /workspace/task.md).
        description: String,
    },
    /// List tasks.
    #[command(visible_alias = "list")]
    Ls,
    /// Show one task: status, result, merge, timings.
    Info {
        /// The task id.
        id: String,
    },
    /// Show a task's command output (secrets masked): its last lines, or
    /// with --offset the bytes from there on. Offsets count everything the
    /// command printed; the log keeps its newest part under a cap
    /// (`task.max_log_bytes` in config.json, default 64 MiB).
    Logs {
        /// The task id.
        id: String,
        /// Lines from the end (within the last --limit bytes).
        #[arg(
            short = 'l',
            long = "tail",
            visible_alias = "lines",
            default_value_t = 100
        )]
        tail: usize,
        /// Print the bytes from this offset on instead (to the log's end,
        /// or --limit bytes).
        #[arg(long, conflicts_with = "tail")]
        offset: Option<u64>,
        /// Most bytes printed (default: 1 MiB for the last lines and with
        /// --json, at most 4 MiB there; all from --offset on).
        #[arg(long)]
        limit: Option<u64>,
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
    #[command(visible_aliases = ["remove", "delete"])]
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
    print!("{}", describe_text(t));
}

/// `task info` as text. The summary, reasons, conflicting paths and
/// errors come from the guest and its commits: shown through
/// [`output::field`], so they cannot drive the terminal.
fn describe_text(t: &TaskInfo) -> String {
    use std::fmt::Write;
    let f = |s: &str| output::field(s).into_owned();
    let mut out = String::new();
    let _ = writeln!(out, "task:      {}", f(&t.task_id));
    let _ = writeln!(out, "status:    {}", status(t));
    let _ = writeln!(
        out,
        "repo:      {} (branch {} at {})",
        f(&t.repo),
        f(&t.branch),
        f(short(&t.base))
    );
    let _ = writeln!(out, "workspace: {}", f(&t.workspace));
    if let Some(slot) = t.slot {
        let _ = writeln!(out, "slot:      {slot}");
    }
    if let Some(code) = t.exit_code {
        let _ = writeln!(out, "exit code: {code}");
    }
    if let Some(r) = &t.result {
        let _ = writeln!(
            out,
            "result:    {}{}",
            if r.success { "success" } else { "failure" },
            r.summary
                .as_deref()
                .map(|s| format!(": {}", f(s)))
                .unwrap_or_default()
        );
    }
    if let Some(m) = &t.merge_result {
        let how = match (m.merged, m.method) {
            (true, Some(method)) => format!("merged ({method:?}) "),
            _ => "not merged ".into(),
        };
        let _ = writeln!(
            out,
            "merge:     {how}{} commit(s), kept at {}{}",
            m.commits,
            f(&m.task_ref),
            m.reason
                .as_deref()
                .map(|r| format!("; {}", f(r)))
                .unwrap_or_default()
        );
        if !m.conflicts.is_empty() {
            let _ = writeln!(out, "conflicts: {}", f(&m.conflicts.join(", ")));
        }
    }
    if let Some(e) = &t.error {
        let _ = writeln!(out, "error:     {}", f(e));
    }
    out
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
            // What fails cheaply fails before an image is built for it.
            ws.secrets().require(secrets)?;
            ws.repos().get(repo)?;
            let wanted = image
                .as_deref()
                .unwrap_or(workspace::tasks::service::TASK_IMAGE);
            use crate::first_need::{build_if_missing, Need};
            build_if_missing(ws, wanted, Need::Git, json).await?;
            let mut req = workspace::tasks::TaskRequest::new(description, repo);
            req.image = image.clone();
            req.branch = branch.clone();
            req.secrets = secrets.clone();
            req.keep = *keep;
            req.no_queue = *no_queue;
            req.mem_mib = *mem_mib;
            let mut info = ws.tasks().run(&req)?;
            if *wait {
                info = ws.tasks().wait(&info.task_id, Duration::MAX).await?;
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
            let all = ws.tasks().list(true)?;
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
            let info = ws.tasks().info(id)?;
            if json {
                output::json(&info);
            } else {
                describe(&info);
            }
        }
        TaskCommand::Logs {
            id,
            tail,
            offset,
            limit,
            follow,
        } => {
            logs(ws, id, *tail, *offset, *limit, *follow, json).await?;
        }
        TaskCommand::Wait { id, timeout } => {
            let timeout = Duration::from_secs(*timeout);
            let info = match id {
                Some(id) => Some(ws.tasks().wait(id, timeout).await?),
                None => ws.tasks().wait_next_event(timeout).await?,
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
            if *force && !ws.tasks().info(id)?.status.is_final() {
                ws.tasks().cancel(id).await?;
                ws.tasks().wait(id, Duration::from_secs(300)).await?;
            }
            let info = ws.tasks().cleanup(id, *delete_ref, false)?;
            if json {
                output::json(
                    &serde_json::json!({ "removed": info.task_id, "ref_deleted": delete_ref }),
                );
            } else {
                println!("removed task {}", info.task_id);
            }
        }
        TaskCommand::Slots => {
            let slots = ws.tasks().slots()?;
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
            let info = ws.tasks().supervise(id).await?;
            eprintln!("task {id} ended: {:?}", info.status);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Bytes a read takes unless --limit says.
const CLI_LOG_READ: u64 = 1 << 20;

/// `task logs`: one bounded read for --json; printed in chunks of at most
/// [`CLI_LOG_READ`] otherwise, so no read holds the whole log.
async fn logs(
    ws: &Workspaces,
    id: &str,
    tail: usize,
    offset: Option<u64>,
    limit: Option<u64>,
    follow: bool,
    json: bool,
) -> Result<(), Error> {
    if limit == Some(0) || (json && limit.is_some_and(|l| l > MAX_LOG_READ)) {
        return Err(Error::InvalidInput(format!(
            "--limit is 1 to {MAX_LOG_READ} bytes{}",
            if json { " with --json" } else { "" }
        )));
    }
    let first = limit.unwrap_or(CLI_LOG_READ).min(MAX_LOG_READ);
    let range = match offset {
        Some(offset) => LogRange::From {
            offset,
            limit: first,
        },
        None => LogRange::Tail {
            lines: tail,
            limit: first,
        },
    };
    let logs = ws.tasks().logs(id, range)?;
    if json && !follow {
        output::json(&logs);
        return Ok(());
    }
    say_dropped(offset, &logs);
    print_raw(&logs.text);
    let mut next = logs.next_offset;
    if offset.is_some() {
        // From an offset: on to the end, or to --limit bytes.
        let mut left = limit.map(|l| l.saturating_sub(logs.next_offset - logs.offset));
        while next < logs.size && left != Some(0) {
            let want = left.unwrap_or(CLI_LOG_READ).min(CLI_LOG_READ);
            let more = ws.tasks().logs(
                id,
                LogRange::From {
                    offset: next,
                    limit: want,
                },
            )?;
            if more.next_offset == more.offset {
                break;
            }
            say_dropped(Some(next), &more);
            print_raw(&more.text);
            left = left.map(|l| l.saturating_sub(more.next_offset - more.offset));
            next = more.next_offset;
        }
    }
    if follow {
        follow_log(ws, id, next).await?;
    }
    Ok(())
}

/// Says on stderr (stdout is the log's) when what was asked for reaches
/// back past what the log keeps (`asked_from`: the offset asked for; none
/// for the last lines).
fn say_dropped(asked_from: Option<u64>, logs: &workspace::tasks::TaskLogs) {
    let reaches_back = asked_from.is_none_or(|a| a < logs.offset);
    if logs.dropped_bytes > 0 && logs.offset == logs.dropped_bytes && reaches_back {
        eprintln!(
            "microagent: the first {} bytes of this log were dropped (it is capped at {} bytes)",
            logs.dropped_bytes, logs.max_log_bytes
        );
    }
}

fn print_raw(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Prints what the log gains from `offset` until the task ends, in reads
/// of at most [`CLI_LOG_READ`] bytes (offsets survive the log's cuts).
async fn follow_log(ws: &Workspaces, id: &str, mut offset: u64) -> Result<(), Error> {
    loop {
        let ended = ws.tasks().info(id)?.status.is_final();
        loop {
            let chunk = ws.tasks().logs(
                id,
                LogRange::From {
                    offset,
                    limit: CLI_LOG_READ,
                },
            )?;
            if chunk.offset > offset {
                eprintln!(
                    "microagent: {} bytes were dropped from the log before they were read",
                    chunk.offset - offset
                );
            }
            print_raw(&chunk.text);
            offset = chunk.next_offset;
            if chunk.next_offset >= chunk.size || chunk.next_offset == chunk.offset {
                break;
            }
        }
        if ended {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_info_shows_guest_text_escaped() {
        let info: TaskInfo = serde_json::from_value(serde_json::json!({
            "task_id": "t-1", "status": "failed", "repo": "app", "branch": "main",
            "base": "0123456789abcdef", "image": "debian", "description": "fix it",
            "workspace": "task-t-1", "keep": false, "timings": {"created_ms": 0},
            "result": {"success": false,
                       "summary": "done\u{1b}]0;pwned\u{7}\u{1b}[2J\r\nrm -rf ~"},
            "merge_result": {"merged": false, "commits": 1, "task_ref": "refs/tasks/t-1",
                             "conflicts": ["a\u{1b}[8mhidden"], "reason": "no\u{9b}31m"},
            "error": "guest said \u{1b}[?1049h",
        }))
        .unwrap();
        let text = describe_text(&info);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{9b}'),
            "{text:?}"
        );
        assert!(!text.contains('\r') && !text.contains('\u{7}'), "{text:?}");
        assert!(
            text.contains("result:    failure: done^[]0;pwned^G^[[2J^M^Jrm -rf ~\n"),
            "{text}"
        );
        assert!(text.contains("; no\\u{9b}31m\n"), "{text}");
        assert!(text.contains("conflicts: a^[[8mhidden\n"), "{text}");
        assert!(text.contains("error:     guest said ^[[?1049h\n"), "{text}");
        // One line per field: the guest's newline did not make a new one.
        assert_eq!(text.lines().count(), 8, "{text}");
    }
}
