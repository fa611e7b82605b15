//! `microagent repo allow | ls | rm | pull | diff`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use workspace::{Error, Workspaces};

use crate::output;

#[derive(Debug, Subcommand)]
pub enum RepoCommand {
    /// Put a host git work tree on the allowlist, so workspaces and tasks
    /// may clone it (`create WS --repo ALIAS`). Nothing else is ever cloned.
    Allow {
        /// The repository (default: the current directory).
        path: Option<PathBuf>,
        /// The name to use for it (default: its directory's name).
        #[arg(long)]
        alias: Option<String>,
        /// The shell line a task runs in the guest's clone, e.g. `claude -p
        /// "$(cat /workspace/task.md)"` (default: config.json `task.command`).
        #[arg(long, value_name = "CMD")]
        task_command: Option<String>,
    },
    /// List allowed repositories.
    #[command(visible_alias = "list")]
    Ls,
    /// Take a repository off the allowlist (the repository is not touched).
    #[command(visible_aliases = ["remove", "delete"])]
    Rm {
        /// Its alias.
        alias: String,
    },
    /// Bring a workspace's new commits to the host repository as
    /// `refs/workspaces/WS` (its clone's HEAD; `git log refs/workspaces/WS`).
    Pull {
        /// The workspace.
        workspace: String,
    },
    /// Show what a workspace changed in its clone since it was made
    /// (committed or not).
    Diff {
        /// The workspace.
        workspace: String,
        /// A summary per file instead of the patch.
        #[arg(long)]
        stat: bool,
    },
}

pub async fn run(ws: &Workspaces, cmd: &RepoCommand, json: bool) -> Result<ExitCode, Error> {
    match cmd {
        RepoCommand::Allow {
            path,
            alias,
            task_command,
        } => {
            let path = match path {
                Some(p) => p.clone(),
                None => std::env::current_dir()
                    .map_err(Error::host_io("reading the current directory"))?,
            };
            let info = ws
                .repos()
                .allow(&path, alias.as_deref(), task_command.clone())?;
            if json {
                output::json(&info);
            } else {
                println!(
                    "allowed {} as `{}`; clone it with `microagent create WS --image debian --repo {}`",
                    info.path.display(),
                    info.alias,
                    info.alias
                );
            }
        }
        RepoCommand::Ls => {
            let all = ws.repos().list()?;
            if json {
                output::json(&all);
            } else {
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .map(|r| {
                        vec![
                            r.alias.clone(),
                            r.path.display().to_string(),
                            r.task_command.clone().unwrap_or_else(|| "-".into()),
                        ]
                    })
                    .collect();
                output::table(&["ALIAS", "PATH", "TASK COMMAND"], &rows);
            }
        }
        RepoCommand::Rm { alias } => {
            let info = ws.repos().remove(alias)?;
            if json {
                output::json(&serde_json::json!({ "removed": info }));
            } else {
                println!(
                    "removed `{}` ({}) from the allowlist",
                    info.alias,
                    info.path.display()
                );
            }
        }
        RepoCommand::Pull { workspace } => {
            let pull = ws.workspace(workspace)?.pull_repo().await?;
            if json {
                output::json(&pull);
            } else {
                // The branch and head name what the guest's repository
                // says: escaped, and cut by characters.
                let short = |sha: &str| {
                    output::field(&sha.chars().take(12).collect::<String>()).into_owned()
                };
                let r = pull.host_ref.as_deref().map(output::field);
                match r {
                    Some(r) => println!(
                        "{} new commit(s) from {} ({}) are at {r} in `{}`; see them with `git log {}..{r}`",
                        pull.commits,
                        pull.workspace,
                        output::field(&pull.branch),
                        pull.repo,
                        short(&pull.base)
                    ),
                    None => println!(
                        "{} has no new commits since it was made (HEAD {})",
                        pull.workspace,
                        short(&pull.head)
                    ),
                }
            }
        }
        RepoCommand::Diff { workspace, stat } => {
            let diff = ws.workspace(workspace)?.repo_diff(*stat).await?;
            if json {
                output::json(&serde_json::json!({ "workspace": workspace, "diff": diff }));
            } else {
                // The guest's changes: file contents and names, escaped.
                print!("{}", output::inert(&diff));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
