//! Code-session tools: code_session_start, code_run,
//! code_session_restart, code_session_stop, code_session_list. A session
//! is a Jupyter kernel in a workspace; its id names its workspace
//! (`WORKSPACE/code-N`), so each call checks that workspace's owner as any
//! other call on it does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use workspace::code_sessions::{is_session_id, CodeRunLimits, DEFAULT_RUN_TIMEOUT};

use super::in_range;
use crate::error::ToolError;
use crate::output::{Out, ToolResult};
use crate::progress::Progress;
use crate::schema::code::*;
use crate::MicroagentServer;

/// The workspace and the session's id of `WORKSPACE/code-N`.
fn split_session(session: &str) -> Result<(&str, &str), ToolError> {
    if session.len() > MAX_SESSION_CHARS {
        return Err(ToolError::InvalidInput(format!(
            "session is over {MAX_SESSION_CHARS} characters"
        )));
    }
    match session.rsplit_once('/') {
        Some((name, id)) if !name.is_empty() && is_session_id(id) => Ok((name, id)),
        _ => Err(ToolError::InvalidInput(format!(
            "session {session:?} is not one code_session_start returned (WORKSPACE/code-N)"
        ))),
    }
}

/// The last `max` bytes of `text`, on a character boundary.
fn tail(text: &str, max: usize) -> &str {
    let mut at = text.len().saturating_sub(max);
    while !text.is_char_boundary(at) {
        at += 1;
    }
    &text[at..]
}

#[tool_router(router = code_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Start a code session in a workspace: a Jupyter kernel (Python's
    /// ipykernel) that keeps variables, imports and the working directory
    /// between code_run calls. The workspace's image must have the kernel:
    /// image `code` (python3 with ipykernel, numpy, pandas, matplotlib;
    /// built on the host with `microagent setup --with code`, which makes
    /// a kernel of each language ahead: a fresh workspace's first session
    /// takes it at once; otherwise a kernel's start takes minutes here).
    /// At most 8 sessions a workspace; they end with its stop.
    #[tool(
        output_schema = crate::output::schema::<CodeSessionResult>(),
        annotations(
        title = "Start a code session",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn code_session_start(
        &self,
        Parameters(p): Parameters<CodeSessionStartParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<CodeSessionResult> {
        let start = self.ws.workspace(&p.workspace)?.code().start(p.language);
        let info = Progress::new(&ctx)
            .drive(start, |elapsed| {
                format!(
                    "starting a {} kernel in {}: {} s",
                    p.language.as_str(),
                    p.workspace,
                    elapsed.as_secs()
                )
            })
            .await?;
        Ok(Out(CodeSessionResult::new(&p.workspace, info)))
    }

    /// Run code in a session and return what it printed (stdout, stderr),
    /// the last expression's value (`result`), what it raised (`error`:
    /// name, value, traceback) and what it displayed (`outputs`: a
    /// matplotlib figure or image as image content, HTML such as a
    /// DataFrame's table, JSON). Progress notifications carry its output
    /// as it comes. Past timeout_secs, or when the call is cancelled, the
    /// code is interrupted (KeyboardInterrupt) and the session goes on.
    #[tool(
        output_schema = crate::output::schema::<CodeRunResult>(),
        annotations(
        title = "Run code in a session",
        read_only_hint = false,
        destructive_hint = false,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn code_run(
        &self,
        Parameters(p): Parameters<CodeRunParams>,
        ctx: RequestContext<RoleServer>,
    ) -> ToolResult<CodeRunResult> {
        let timeout = match p.timeout_secs {
            Some(secs) => Duration::from_secs(in_range("timeout_secs", secs, 1, MAX_RUN_SECS)?),
            None => DEFAULT_RUN_TIMEOUT,
        };
        if p.code.len() > MAX_CODE_BYTES {
            return Err(ToolError::InvalidInput(format!(
                "code is {} bytes; at most {MAX_CODE_BYTES}",
                p.code.len()
            )));
        }
        let (name, id) = split_session(&p.session)?;
        let printed = Arc::new(Mutex::new(String::new()));
        let heard = printed.clone();
        let on_stream = move |_: &str, text: &str| {
            let mut kept = heard.lock().unwrap_or_else(|e| e.into_inner());
            kept.push_str(text);
            let keep = tail(&kept, 4096).len();
            let cut = kept.len() - keep;
            kept.drain(..cut);
        };
        let cancel = ctx.ct.clone().cancelled_owned();
        let run = self.ws.workspace(name)?.code().run(
            id,
            &p.code,
            timeout,
            CodeRunLimits::default(),
            cancel,
            on_stream,
        );
        let ran = Progress::new(&ctx)
            .drive(run, |elapsed| {
                let mut kept = printed.lock().unwrap_or_else(|e| e.into_inner());
                let new = std::mem::take(&mut *kept);
                format!(
                    "running code in {}: {} s\n{}",
                    p.session,
                    elapsed.as_secs(),
                    tail(&new, 1024)
                )
            })
            .await?;
        if ran.stopped.as_deref() == Some("cancelled") {
            return Err(ToolError::Cancelled(format!(
                "the code in {} was interrupted; the session goes on",
                p.session
            )));
        }
        Ok(Out(CodeRunResult {
            session: p.session,
            run: ran,
        }))
    }

    /// Restart a session's kernel: what it held (variables, imports) is
    /// gone; the session id stays.
    #[tool(
        output_schema = crate::output::schema::<CodeSessionResult>(),
        annotations(
        title = "Restart a code session",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn code_session_restart(
        &self,
        Parameters(p): Parameters<CodeSessionParams>,
    ) -> ToolResult<CodeSessionResult> {
        let (name, id) = split_session(&p.session)?;
        let info = self.ws.workspace(name)?.code().restart(id).await?;
        Ok(Out(CodeSessionResult::new(name, info)))
    }

    /// End a session: its kernel shuts down and the id is forgotten.
    #[tool(
        output_schema = crate::output::schema::<CodeSessionStopped>(),
        annotations(
        title = "Stop a code session",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn code_session_stop(
        &self,
        Parameters(p): Parameters<CodeSessionParams>,
    ) -> ToolResult<CodeSessionStopped> {
        let (name, id) = split_session(&p.session)?;
        self.ws.workspace(name)?.code().stop(id).await?;
        Ok(Out(CodeSessionStopped { session: p.session }))
    }

    /// List a workspace's code sessions (a stopped or hibernated workspace
    /// is not woken: its sessions show as ended).
    #[tool(
        output_schema = crate::output::schema::<CodeSessionList>(),
        annotations(
        title = "List code sessions",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn code_session_list(
        &self,
        Parameters(p): Parameters<CodeSessionListParams>,
    ) -> ToolResult<CodeSessionList> {
        let listed = self.ws.workspace(&p.workspace)?.code().list().await?;
        Ok(Out(CodeSessionList {
            sessions: listed
                .into_iter()
                .map(|info| CodeSessionResult::new(&p.workspace, info))
                .collect(),
            workspace: p.workspace,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::{split_session, tail};

    #[test]
    fn a_session_id_names_its_workspace() {
        assert_eq!(split_session("dev/code-1").unwrap(), ("dev", "code-1"));
        assert_eq!(
            split_session("team/dev/code-2").unwrap(),
            ("team/dev", "code-2")
        );
        let long = format!("{}/code-1", "d".repeat(300));
        for bad in [
            "code-1",
            "/code-1",
            "dev/",
            "",
            "dev/x",
            "dev/code-../x",
            "dev/code-1234567",
            &long,
        ] {
            assert!(split_session(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_tail_is_cut_on_a_character() {
        assert_eq!(tail("héllo", 4), "llo");
        assert_eq!(tail("abc", 10), "abc");
    }
}
