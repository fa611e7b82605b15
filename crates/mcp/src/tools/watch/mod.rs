//! File-watch tools: file_watch, file_watch_events, file_unwatch. The
//! guest agent keeps a watch and its events, so a later call (or a
//! restarted server) reads on from an event number. A watch id names its
//! workspace (`WORKSPACE/watch-N`), so each call checks that workspace's
//! owner as any other call on it does.

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};

use super::in_range;
use crate::error::ToolError;
use crate::output::{Out, ToolResult};
use crate::progress::Progress;
use crate::schema::watch::*;
use crate::MicroagentServer;

/// The workspace and the agent's id of a watch id `WORKSPACE/watch-N`.
fn split_watch(watch: &str) -> Result<(&str, &str), ToolError> {
    match watch.rsplit_once('/') {
        Some((name, id)) if !name.is_empty() && workspace::guest::is_watch_id(id) => Ok((name, id)),
        _ => Err(ToolError::InvalidInput(format!(
            "watch {watch:?} is not a watch file_watch returned (WORKSPACE/watch-N)"
        ))),
    }
}

#[tool_router(router = watch_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Watch a guest directory (recursive: and every directory below it)
    /// or file for changes; returns a watch id at once. Read its events
    /// (created, modified, deleted, moved) with file_watch_events, which
    /// can wait for the next one; stop it with file_unwatch. The guest
    /// keeps the watch and its last 1024 events between calls; at most 16
    /// watches per workspace.
    #[tool(
        output_schema = crate::output::schema::<FileWatchResult>(),
        annotations(
        title = "Watch files for changes",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn file_watch(
        &self,
        Parameters(p): Parameters<FileWatchParams>,
    ) -> ToolResult<FileWatchResult> {
        let info = self
            .ws
            .workspace(&p.name)?
            .watches()
            .watch_start(&p.path, p.recursive)
            .await?;
        Ok(Out(FileWatchResult {
            watch: format!("{}/{}", p.name, info.id),
            workspace: p.name,
            path: info.path,
            recursive: info.recursive,
            dirs: info.dirs,
        }))
    }

    /// Read a watch's events from an event number (0, then the `next` the
    /// previous call returned). With timeout_ms it waits for the next
    /// event when none is there yet. `ended` says its path went away.
    #[tool(
        output_schema = crate::output::schema::<FileWatchEventsResult>(),
        annotations(
        title = "Read a watch's file events",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn file_watch_events(
        &self,
        Parameters(p): Parameters<FileWatchEventsParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<FileWatchEventsResult> {
        let wait = in_range(
            "timeout_ms",
            p.timeout_ms.unwrap_or(0),
            0,
            MAX_EVENTS_WAIT_MS,
        )?;
        let (name, id) = split_watch(&p.watch)?;
        let read = self.ws.workspace(name)?.watches().watch_events(
            id,
            p.since,
            Duration::from_millis(wait),
        );
        let changes = Progress::new(&ctx)
            .drive(read, |elapsed| {
                format!(
                    "waiting for changes of {}: {} s",
                    p.watch,
                    elapsed.as_secs()
                )
            })
            .await?;
        Ok(Out(FileWatchEventsResult {
            ended: changes.watch.ended,
            watch: p.watch,
            events: changes.changes,
            next: changes.next,
        }))
    }

    /// Stop a watch; its events are forgotten.
    #[tool(
        output_schema = crate::output::schema::<FileUnwatchResult>(),
        annotations(
        title = "Stop watching files",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn file_unwatch(
        &self,
        Parameters(p): Parameters<FileUnwatchParams>,
    ) -> ToolResult<FileUnwatchResult> {
        let (name, id) = split_watch(&p.watch)?;
        self.ws.workspace(name)?.watches().watch_stop(id).await?;
        Ok(Out(FileUnwatchResult { watch: p.watch }))
    }
}

#[cfg(test)]
mod tests {
    use super::split_watch;

    #[test]
    fn a_watch_id_names_its_workspace() {
        assert_eq!(split_watch("dev/watch-1").unwrap(), ("dev", "watch-1"));
        assert_eq!(
            split_watch("team/dev/watch-2").unwrap(),
            ("team/dev", "watch-2")
        );
        let long = format!("dev/watch-{}", "9".repeat(300));
        for bad in ["watch-1", "/watch-1", "dev/", "", "dev/x", &long] {
            assert!(split_watch(bad).is_err(), "{bad}");
        }
    }
}
