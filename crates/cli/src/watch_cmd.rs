//! `microagent watch WS PATH [--recursive]`: prints each change under a
//! guest path as it comes (created, modified, deleted, moved), until
//! Ctrl-C, which ends the watch. With `--json`, one event object a line.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use workspace::guest::{ChangeKind, FileChange};
use workspace::{Error, Workspaces};

use crate::output;

/// Each long poll (the agent answers at once when a change comes).
const POLL: Duration = Duration::from_secs(30);

pub async fn run(
    ws: &Workspaces,
    name: &str,
    path: &str,
    recursive: bool,
    json: bool,
) -> Result<ExitCode, Error> {
    let watches = ws.workspace(name)?.watches();
    let watch = watches.watch_start(path, recursive).await?;
    if !json {
        let below = if recursive { " and below" } else { "" };
        eprintln!(
            "watching {}{below} in {name} (Ctrl-C ends the watch)",
            watch.path
        );
    }
    let id = watch.id.clone();
    let follow = async {
        let mut since = 0;
        loop {
            let changes = watches.watch_events(&id, since, POLL).await?;
            since = changes.next;
            let mut out = std::io::stdout().lock();
            for change in &changes.changes {
                let line = if json {
                    serde_json::to_string(change).unwrap_or_default()
                } else {
                    describe(change)
                };
                // A closed stdout (`| head`) ends the watch.
                if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                    return Ok(());
                }
            }
            if changes.watch.ended {
                if !json {
                    eprintln!("{} is gone: the watch has ended", watch.path);
                }
                return Ok(());
            }
        }
    };
    let followed: Result<(), Error> = tokio::select! {
        r = follow => r,
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    // Ended either way; a workspace that stopped has no watch left.
    let _ = watches.watch_stop(&id).await;
    followed?;
    Ok(ExitCode::SUCCESS)
}

/// `created /work/a`, `moved /work/a -> /work/b`.
fn describe(change: &FileChange) -> String {
    let kind = match change.kind {
        ChangeKind::Created => "created",
        ChangeKind::Modified => "modified",
        ChangeKind::Deleted => "deleted",
        ChangeKind::Moved => "moved",
        ChangeKind::Overflow => "overflow (changes were lost)",
        ChangeKind::Other => "changed",
    };
    let path = output::field(&change.path);
    match &change.to {
        Some(to) => format!("{kind} {path} -> {}", output::field(to)),
        None => format!("{kind} {path}"),
    }
}
