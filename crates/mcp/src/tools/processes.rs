//! Background-process tools: process_start, process_list, process_output,
//! process_write_stdin, process_signal, process_wait. A process outlives
//! the call that started it, the client and this server: the guest agent
//! keeps it and its output, so a later call (or a restarted server) reads
//! on from a cursor.

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use workspace::guest::ProcessOptions;

use super::exec::command_request;
use super::in_range;
use crate::output::{Out, ToolResult};
use crate::progress::Progress;
use crate::schema::exec::MAX_EXEC_TIMEOUT_SECS;
use crate::schema::processes::*;
use crate::MicroagentServer;

#[tool_router(router = processes_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Start a command in the background and return its process id at
    /// once: for servers, watchers and anything longer than one call. Read
    /// its output with process_output (from cursors, long-polling with
    /// wait_secs), wait for it with process_wait, stop it with
    /// process_signal. It keeps running when this client disconnects.
    #[tool(
        output_schema = crate::output::schema::<ProcessResult>(),
        annotations(
        title = "Start a background process",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn process_start(
        &self,
        Parameters(p): Parameters<ProcessStartParams>,
    ) -> ToolResult<ProcessResult> {
        self.grants.check_secrets(&p.secrets)?;
        let mut req = command_request(p.command, p.shell)?
            .envs(p.env)
            .secrets(p.secrets);
        if let Some(dir) = p.cwd {
            req = req.cwd(dir);
        }
        if let Some(user) = p.user {
            req = req.user(user);
        }
        if let Some(t) = p.timeout_secs {
            let secs = in_range("timeout_secs", t, 1, MAX_EXEC_TIMEOUT_SECS)?;
            req = req.timeout(Duration::from_secs(secs));
        }
        let ring_bytes = match p.ring_bytes {
            Some(n) => Some(in_range(
                "ring_bytes",
                n,
                0,
                workspace::guest::MAX_PROCESS_RING,
            )?),
            None => None,
        };
        let options = ProcessOptions {
            stdin: p.stdin,
            ring_bytes,
            id: None,
        };
        let process = self
            .ws
            .workspace(&p.name)?
            .processes()
            .process_start(req, options)
            .await?;
        Ok(Out(ProcessResult {
            workspace: p.name,
            process,
        }))
    }

    /// List a workspace's background processes: id, pid, command, state,
    /// exit code or signal, bytes of output. Finished ones stay listed
    /// until 32 newer ones have finished.
    #[tool(
        output_schema = crate::output::schema::<ProcessListResult>(),
        annotations(
        title = "List background processes",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn process_list(
        &self,
        Parameters(p): Parameters<ProcessListParams>,
    ) -> ToolResult<ProcessListResult> {
        let processes = self
            .ws
            .workspace(&p.name)?
            .processes()
            .process_list()
            .await?;
        Ok(Out(ProcessListResult {
            workspace: p.name,
            processes,
        }))
    }

    /// Read a background process's stdout and stderr from byte cursors (0
    /// for the start; then the cursors the previous call returned). With
    /// wait_secs it waits for new output or the exit. `finished` says
    /// nothing more will come.
    #[tool(
        output_schema = crate::output::schema::<ProcessOutputResult>(),
        annotations(
        title = "Read a background process's output",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn process_output(
        &self,
        Parameters(p): Parameters<ProcessOutputParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<ProcessOutputResult> {
        let wait = in_range(
            "wait_secs",
            p.wait_secs.unwrap_or(0),
            0,
            MAX_OUTPUT_WAIT_SECS,
        )?;
        let max = in_range(
            "max_bytes",
            p.max_bytes.unwrap_or(DEFAULT_READ_BYTES),
            1,
            MAX_READ_BYTES,
        )?;
        let cursors = [p.stdout_cursor, p.stderr_cursor];
        let read = self.ws.workspace(&p.name)?.processes().process_output(
            &p.id,
            cursors,
            Some(max),
            Duration::from_secs(wait),
        );
        let id = p.id.clone();
        let out = Progress::new(&ctx)
            .drive(read, |elapsed| {
                format!("waiting for output of {id}: {} s", elapsed.as_secs())
            })
            .await?;
        let finished = out.finished();
        Ok(Out(ProcessOutputResult {
            workspace: p.name,
            stdout: String::from_utf8_lossy(&out.stdout.bytes).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr.bytes).into_owned(),
            stdout_cursor: out.stdout.next_cursor,
            stderr_cursor: out.stderr.next_cursor,
            stdout_dropped: out.stdout.dropped,
            stderr_dropped: out.stderr.dropped,
            process: out.process,
            finished,
        }))
    }

    /// Write text to a background process's stdin (it must have been
    /// started with stdin true), and/or close it with close true.
    #[tool(
        output_schema = crate::output::schema::<ProcessActionResult>(),
        annotations(
        title = "Write to a background process's stdin",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn process_write_stdin(
        &self,
        Parameters(p): Parameters<ProcessStdinParams>,
    ) -> ToolResult<ProcessActionResult> {
        let written = self
            .ws
            .workspace(&p.name)?
            .processes()
            .process_write_stdin(&p.id, p.data.as_bytes(), p.close)
            .await?;
        let mut action = format!("wrote {written} bytes");
        if p.close {
            action.push_str(" and closed stdin");
        }
        Ok(Out(ProcessActionResult {
            workspace: p.name,
            id: p.id,
            action,
            preview: false,
        }))
    }

    /// Send a signal (default TERM) to a background process and its
    /// process group. preview: true says which process would get it.
    #[tool(
        output_schema = crate::output::schema::<ProcessActionResult>(),
        annotations(
        title = "Signal a background process",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn process_signal(
        &self,
        Parameters(p): Parameters<ProcessSignalParams>,
    ) -> ToolResult<ProcessActionResult> {
        let signal = p.signal.unwrap_or_else(|| "TERM".into());
        if p.preview {
            // A wait of no time reads it (NOT_FOUND when there is none).
            let process = self
                .ws
                .workspace(&p.name)?
                .processes()
                .process_wait(&p.id, std::time::Duration::ZERO)
                .await?;
            let action = if process.running() {
                format!(
                    "would send {signal} to it and its group ({})",
                    process.status()
                )
            } else {
                format!("nothing: it has ended ({})", process.status())
            };
            return Ok(Out(ProcessActionResult {
                workspace: p.name,
                id: p.id,
                action,
                preview: true,
            }));
        }
        self.ws
            .workspace(&p.name)?
            .processes()
            .process_signal(&p.id, &signal)
            .await?;
        Ok(Out(ProcessActionResult {
            workspace: p.name,
            id: p.id,
            action: format!("sent {signal}"),
            preview: false,
        }))
    }

    /// Wait up to timeout_secs for a background process to exit; returns
    /// it with its exit code or signal, or still `running` when the time
    /// ran out.
    #[tool(
        output_schema = crate::output::schema::<ProcessResult>(),
        annotations(
        title = "Wait for a background process",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn process_wait(
        &self,
        Parameters(p): Parameters<ProcessWaitParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<ProcessResult> {
        let secs = in_range(
            "timeout_secs",
            p.timeout_secs.unwrap_or(DEFAULT_WAIT_SECS),
            0,
            MAX_WAIT_SECS,
        )?;
        let wait = self
            .ws
            .workspace(&p.name)?
            .processes()
            .process_wait(&p.id, Duration::from_secs(secs));
        let id = p.id.clone();
        let process = Progress::new(&ctx)
            .drive(wait, |elapsed| {
                format!("waiting for {id} to exit: {} s", elapsed.as_secs())
            })
            .await?;
        Ok(Out(ProcessResult {
            workspace: p.name,
            process,
        }))
    }
}
