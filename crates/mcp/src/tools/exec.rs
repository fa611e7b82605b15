//! Tools that run commands: `workspace_exec` and `run_code`. Both send
//! progress while the command runs (when asked), and a cancelled call kills
//! the command's process group in the guest.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use workspace::store::spec::defaults;
use workspace::ExecRequest;
use workspace::{guest::ExecEnd, OneShot};
use workspace::{guest::ExecEvent, guest::OutputCollector, ExecInput};

use super::{in_range, seconds, vcpus};
use crate::output::{Out, ToolResult};
use crate::progress::Progress;
use crate::schema::exec::*;
use crate::schema::lifecycle::{DEFAULT_START_TIMEOUT_SECS, MAX_START_TIMEOUT_SECS};
use crate::{MicroagentServer, ToolError};

/// How a command is to run, checked.
pub(super) struct RunLimits {
    timeout: Option<Duration>,
    cap: u64,
}

pub(super) fn limits(
    timeout_secs: Option<u64>,
    output_cap: Option<u64>,
) -> Result<RunLimits, ToolError> {
    let timeout = match timeout_secs {
        Some(t) => Some(Duration::from_secs(in_range(
            "timeout_secs",
            t,
            1,
            MAX_EXEC_TIMEOUT_SECS,
        )?)),
        None => None,
    };
    let cap = in_range(
        "output_cap",
        output_cap.unwrap_or(DEFAULT_OUTPUT_CAP),
        0,
        MAX_OUTPUT_CAP,
    )?;
    Ok(RunLimits { timeout, cap })
}

/// The request for `command` (an argv, or one line run as `shell` is) or
/// `shell`: exactly one of them, not empty.
pub(super) fn command_request(
    command: Option<CommandArg>,
    shell: Option<String>,
) -> Result<ExecRequest, ToolError> {
    command_with_args(command, None, shell)
}

/// [`command_request`] with `args` after a program named alone
/// (`command: "ls", args: ["-l"]`): run directly, without a shell.
pub(super) fn command_with_args(
    command: Option<CommandArg>,
    args: Option<Vec<String>>,
    shell: Option<String>,
) -> Result<ExecRequest, ToolError> {
    if let Some(args) = args {
        return match (command, shell) {
            (Some(CommandArg::Line(program)), None) if !program.trim().is_empty() => {
                Ok(ExecRequest::argv(std::iter::once(program).chain(args)))
            }
            _ => Err(ToolError::InvalidInput(
                "args go with command given as one program name (command: \"ls\", args: [\"-l\"]); with an argv array or shell, leave args out".into(),
            )),
        };
    }
    match (command, shell) {
        (Some(CommandArg::Argv(argv)), None) if !argv.is_empty() => Ok(ExecRequest::argv(argv)),
        (Some(CommandArg::Line(line)), None) | (None, Some(line)) if !line.trim().is_empty() => {
            Ok(ExecRequest::shell(line))
        }
        (Some(_), Some(_)) => Err(ToolError::InvalidInput(
            "give either command or shell, not both".into(),
        )),
        _ => Err(ToolError::InvalidInput(
            "no command given; pass command (program and arguments, or one command line) or shell (a /bin/sh -c line)"
                .into(),
        )),
    }
}

pub(super) fn input(stdin: Option<String>) -> ExecInput {
    match stdin {
        Some(text) => ExecInput::Bytes(text.into_bytes()),
        None => ExecInput::None,
    }
}

impl MicroagentServer {
    /// Runs `req` in `name` to the end, or kills it when the call is
    /// cancelled.
    pub(super) async fn run_command(
        &self,
        name: &str,
        mut req: ExecRequest,
        stdin: ExecInput,
        limits: &RunLimits,
        ctx: &RequestContext<RoleServer>,
        progress: &mut Progress,
    ) -> Result<ExecReply, ToolError> {
        if let Some(t) = limits.timeout {
            req = req.timeout(t);
        }
        req = req.output_cap(limits.cap);
        let what = req.describe();
        let output_bytes = AtomicU64::new(0);
        let mut collected = OutputCollector::new(Some(limits.cap));
        let on_event = |event: ExecEvent| {
            if let ExecEvent::Stdout(b) | ExecEvent::Stderr(b) = &event {
                output_bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
            }
            collected.on_event(event);
        };
        let cancel = ctx.ct.clone().cancelled_owned();
        let exec = self
            .ws
            .workspace(name)?
            .exec_cancellable(req, stdin, on_event, cancel);
        let status = |elapsed: Duration| {
            format!(
                "running `{what}` in {name}: {} s, {} bytes of output",
                elapsed.as_secs(),
                output_bytes.load(Ordering::Relaxed)
            )
        };
        match progress.drive(exec, status).await? {
            ExecEnd::Exited(exited) => Ok(ExecReply::new(collected.finish(exited), limits.cap)),
            ExecEnd::Cancelled { killed: true, .. } => Err(ToolError::Cancelled(format!(
                "`{what}` in workspace `{name}` was killed"
            ))),
            ExecEnd::Cancelled { exec_id, .. } => {
                // The client gets no answer to a cancelled call: say it here.
                tracing::warn!(%name, %exec_id, command = %what, "a cancelled command could not be confirmed killed and may still run");
                Err(ToolError::Cancelled(format!(
                    "`{what}` in workspace `{name}` could not be confirmed killed and may still run; workspace_halt ends it"
                )))
            }
        }
    }

    /// `reply` with the files `patterns` match in `name` now; a cancel of
    /// the call drops the collection, which keeps nothing.
    pub(super) async fn bring_outputs(
        &self,
        name: &str,
        patterns: &[String],
        reply: ExecReply,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<ExecReply, ToolError> {
        if patterns.is_empty() {
            return Ok(reply);
        }
        let dev = self.ws.workspace(name)?;
        let outputs = tokio::select! {
            outputs = dev.collect_outputs(patterns) => outputs?,
            () = cancel.cancelled() => {
                return Err(ToolError::Cancelled(
                    "the call was cancelled while its output files were collected; none were kept".into(),
                ))
            }
        };
        Ok(reply.with_outputs(name, &outputs))
    }

    /// Runs `p.code` as a `p.language` script in the running workspace `name`.
    async fn run_snippet(
        &self,
        name: &str,
        p: &RunCodeParams,
        limits: &RunLimits,
        ctx: &RequestContext<RoleServer>,
        progress: &mut Progress,
    ) -> Result<ExecReply, ToolError> {
        let script = self
            .ws
            .workspace(name)?
            .write_code_script(p.language, &p.code)
            .await?;
        let ran = self
            .run_command(
                name,
                script.request(),
                input(p.stdin.clone()),
                limits,
                ctx,
                progress,
            )
            .await;
        script.remove(&self.ws).await;
        self.bring_outputs(name, &p.outputs, ran?, &ctx.ct).await
    }

    /// run_code in a workspace created for it and deleted afterwards.
    async fn run_code_once(
        &self,
        p: RunCodeParams,
        limits: &RunLimits,
        ctx: &RequestContext<RoleServer>,
        progress: &mut Progress,
    ) -> Result<RunCodeResult, ToolError> {
        let start_timeout = seconds(
            "start_timeout_secs",
            p.start_timeout_secs,
            DEFAULT_START_TIMEOUT_SECS,
            MAX_START_TIMEOUT_SECS,
        )?;
        let language = p.language;
        let vcpus = vcpus(p.vcpus, defaults::VCPUS)?;
        let mem_mib = p.mem_mib;
        let (egress, allow) = (p.egress, p.allow.clone());
        let volumes = crate::schema::volumes::mounts(&p.volumes);
        let spec = self
            .blocking(move |ws| {
                let mut spec = language.workspace_spec(ws, vcpus, mem_mib)?;
                spec.egress = egress;
                spec.allow = allow;
                spec.volumes = volumes;
                Ok(spec)
            })
            .await?;
        // Steps in turn: start then work share `progress`.
        let progress = &tokio::sync::Mutex::new(progress);
        let end = self
            .ws
            .run_once(
                &OneShot::new("run-code", spec),
                |name| async move {
                    let mut progress = progress.lock().await;
                    self.start_workspace(&name, false, start_timeout, ctx, &mut progress)
                        .await
                        .map(|_| true)
                },
                |name| async move {
                    let mut progress = progress.lock().await;
                    self.run_snippet(&name, &p, limits, ctx, &mut progress)
                        .await
                },
            )
            .await?;
        if let Err(e) = end.cleanup {
            tracing::warn!(name = %end.workspace, %e, "deleting run_code's one-shot workspace failed");
        }
        let result = end.outcome?.ok_or_else(|| {
            ToolError::Cancelled(format!("workspace {} did not start", end.workspace))
        })?;
        Ok(RunCodeResult {
            workspace: end.workspace,
            one_shot: true,
            language,
            result,
        })
    }
}

#[tool_router(router = exec_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Run a command in a running workspace and return its exit status and
    /// output (each stream capped at output_cap bytes; what is dropped is
    /// counted). Give `command` (program and arguments) or `shell` (a
    /// /bin/sh -c line). Sends progress when asked; cancelling the call
    /// kills the command.
    #[tool(
        output_schema = crate::output::schema::<ExecReply>(),
        annotations(
        title = "Run a command in a workspace",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn workspace_exec(
        &self,
        Parameters(p): Parameters<ExecParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<ExecReply> {
        self.grants.check_secrets(&p.secrets)?;
        let mut req = command_with_args(p.command, p.args, p.shell)?;
        let limits = limits(p.timeout_secs, p.output_cap)?;
        workspace::guest::check_patterns(&p.outputs)?;
        req = req.envs(p.env).secrets(p.secrets);
        if let Some(dir) = p.cwd {
            req = req.cwd(dir);
        }
        if let Some(user) = p.user {
            req = req.user(user);
        }
        let mut progress = Progress::new(&ctx);
        let result = self
            .run_command(&p.name, req, input(p.stdin), &limits, &ctx, &mut progress)
            .await?;
        Ok(Out(self
            .bring_outputs(&p.name, &p.outputs, result, &ctx.ct)
            .await?))
    }

    /// Run code (language python, javascript or bash; default python) and
    /// return its exit status and output. By default in a one-shot
    /// workspace of the `debian` image (created, started and deleted around
    /// the run; the boot takes seconds to tens of seconds); or in a given
    /// running workspace whose image has the interpreter. Sends progress
    /// when asked; cancelling the call kills the program.
    #[tool(
        output_schema = crate::output::schema::<RunCodeResult>(),
        annotations(
        title = "Run code",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn run_code(
        &self,
        Parameters(p): Parameters<RunCodeParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<RunCodeResult> {
        self.grants.check_egress_rules(&p.allow)?;
        let limits = limits(p.timeout_secs, p.output_cap)?;
        workspace::guest::check_patterns(&p.outputs)?;
        let mut progress = Progress::new(&ctx);
        let Some(name) = p.workspace.clone() else {
            return Ok(Out(self
                .run_code_once(p, &limits, &ctx, &mut progress)
                .await?));
        };
        if p.start_timeout_secs.is_some() || p.vcpus.is_some() || p.mem_mib.is_some() {
            return Err(ToolError::InvalidInput(
                "start_timeout_secs, vcpus and mem_mib apply only to one-shot runs (without `workspace`)"
                    .into(),
            ));
        }
        let language = p.language;
        let result = self
            .run_snippet(&name, &p, &limits, &ctx, &mut progress)
            .await?;
        Ok(Out(RunCodeResult {
            workspace: name,
            one_shot: false,
            language,
            result,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked() {
        assert!(limits(Some(0), None).is_err());
        assert!(limits(None, Some(MAX_OUTPUT_CAP + 1)).is_err());
        let l = limits(Some(5), None).unwrap();
        assert_eq!(
            (l.timeout, l.cap),
            (Some(Duration::from_secs(5)), DEFAULT_OUTPUT_CAP)
        );
    }

    #[test]
    fn a_program_with_args_runs_without_a_shell() {
        let line = |s: &str| Some(CommandArg::Line(s.into()));
        let args = Some(vec!["-l".to_owned(), "/tmp dir".to_owned()]);
        let req = command_with_args(line("ls"), args.clone(), None).unwrap();
        assert_eq!(req, ExecRequest::argv(["ls", "-l", "/tmp dir"]));
        // Without args, one string is a shell line, as before.
        let req = command_with_args(line("ls -l"), None, None).unwrap();
        assert_eq!(req, ExecRequest::shell("ls -l"));
        for (command, shell) in [
            (Some(CommandArg::Argv(vec!["ls".into()])), None),
            (None, Some("ls".to_owned())),
            (None, None),
            (line(" "), None),
        ] {
            assert!(command_with_args(command, args.clone(), shell).is_err());
        }
    }
}
