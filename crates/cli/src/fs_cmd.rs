//! `microagent fs`: file operations in a running workspace, one library
//! call each: stat, mkdir, rm, mv, edit, find.

use std::process::ExitCode;

use clap::Subcommand;
use serde_json::json;
use workspace::guest::copy::kind_name;
use workspace::{Error, Workspaces};

use crate::output;

#[derive(Debug, Subcommand)]
pub enum FsCommand {
    /// What is at a guest path (a missing path is `exists: false`).
    Stat {
        /// Workspace name.
        name: String,
        /// Absolute guest path.
        path: String,
    },
    /// Make a guest directory and its missing parents.
    Mkdir {
        /// Workspace name.
        name: String,
        /// Absolute guest path.
        path: String,
    },
    /// Remove a guest file, link or empty directory.
    #[command(visible_aliases = ["remove", "delete"])]
    Rm {
        /// Workspace name.
        name: String,
        /// Absolute guest path.
        path: String,
        /// Remove a directory with everything in it.
        #[arg(short, long)]
        recursive: bool,
        /// Only say what would be removed.
        #[arg(long)]
        preview: bool,
    },
    /// Move (rename) a guest path; a file at the destination is replaced.
    Mv {
        /// Workspace name.
        name: String,
        /// Absolute guest path to move.
        from: String,
        /// Absolute guest path it becomes.
        to: String,
    },
    /// Replace exact text in a guest text file; a count other than
    /// --count changes nothing (CONFLICT, saying how many there are).
    Edit {
        /// Workspace name.
        name: String,
        /// Absolute guest path of a UTF-8 text file.
        path: String,
        /// The exact text to replace.
        #[arg(long = "old")]
        old_text: String,
        /// What replaces it.
        #[arg(long = "new")]
        new_text: String,
        /// How many times the text must occur.
        #[arg(long, default_value_t = 1)]
        count: usize,
    },
    /// Find paths under a guest directory by a glob (`*.py` matches names
    /// at any depth, `src/**/*.rs` paths under the directory).
    Find {
        /// Workspace name.
        name: String,
        /// Absolute guest directory.
        path: String,
        /// The glob.
        pattern: String,
    },
}

pub async fn run(ws: &Workspaces, cmd: &FsCommand, json: bool) -> Result<ExitCode, Error> {
    let absolute = |what: &str, path: &str| {
        if path.starts_with('/') {
            Ok(())
        } else {
            Err(Error::InvalidInput(format!(
                "{what} {path:?} is not absolute; guest paths start with /"
            )))
        }
    };
    let (value, text) = match cmd {
        FsCommand::Stat { name, path } => {
            absolute("path", path)?;
            match ws.workspace(name)?.files().stat_if_exists(path).await? {
                Some(s) => (
                    json!({"path": path, "exists": true, "kind": kind_name(s.kind),
                        "size": s.size, "mode": format!("{:04o}", s.mode),
                        "uid": s.uid, "gid": s.gid, "mtime_s": s.mtime_s}),
                    format!(
                        "{path}: {}, {} bytes, mode {:04o}, owner {}:{}, modified {}",
                        kind_name(s.kind),
                        s.size,
                        s.mode,
                        s.uid,
                        s.gid,
                        s.mtime_s
                    ),
                ),
                None => (
                    json!({"path": path, "exists": false}),
                    format!("{path}: does not exist"),
                ),
            }
        }
        FsCommand::Mkdir { name, path } => {
            absolute("path", path)?;
            ws.workspace(name)?.files().mkdir(path).await?;
            (json!({"path": path}), format!("made the directory {path}"))
        }
        FsCommand::Rm {
            name,
            path,
            recursive,
            preview,
        } => {
            absolute("path", path)?;
            let r = ws
                .workspace(name)?
                .files()
                .remove(path, *recursive, *preview)
                .await?;
            let verb = if *preview { "would remove" } else { "removed" };
            (
                json!({"path": r.path, "kind": kind_name(r.kind), "removed": r.removed, "preview": preview}),
                format!("{verb} the {} {}", kind_name(r.kind), r.path),
            )
        }
        FsCommand::Mv { name, from, to } => {
            absolute("from", from)?;
            absolute("to", to)?;
            ws.workspace(name)?.files().rename(from, to).await?;
            (
                json!({"from": from, "to": to}),
                format!("moved {from} to {to}"),
            )
        }
        FsCommand::Edit {
            name,
            path,
            old_text,
            new_text,
            count,
        } => {
            absolute("path", path)?;
            let e = ws
                .workspace(name)?
                .files()
                .edit_file(path, old_text, new_text, *count, false)
                .await?;
            (
                json!({"path": path, "replacements": e.replacements, "size": e.size}),
                format!(
                    "{path}: {} replacement(s), now {} bytes",
                    e.replacements, e.size
                ),
            )
        }
        FsCommand::Find {
            name,
            path,
            pattern,
        } => {
            absolute("path", path)?;
            let found = ws.workspace(name)?.files().find(path, pattern).await?;
            // Guest file names: one per line, each escaped.
            let names: Vec<_> = found.paths.iter().map(|p| output::field(p)).collect();
            let mut text = names.join("\n");
            if found.truncated {
                text.push_str("\n(stopped early: too many entries)");
            }
            (
                json!({"path": path, "pattern": pattern, "matches": found.paths, "truncated": found.truncated}),
                text,
            )
        }
    };
    if json {
        output::json(&value);
    } else if !text.is_empty() {
        println!("{}", output::inert(&text));
    }
    Ok(ExitCode::SUCCESS)
}
