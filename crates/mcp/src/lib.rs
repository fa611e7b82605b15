//! microagent's MCP server: every workspace operation as a Model Context
//! Protocol tool, spoken as newline-delimited JSON-RPC over stdin/stdout,
//! or over Streamable HTTP ([`http`]) to many clients at once.
//!
//! [`MicroagentServer`] wraps a [`workspace::Workspaces`] and holds no state
//! of its own: workspaces outlive the server process. [`serve_stdio`] is
//! `microagent serve mcp`; [`serve`] runs the same server over any
//! reader/writer pair (the tests use an in-memory pipe).
//!
//! Modules: [`server`] (the handler and its tool router), [`tools`] (one
//! module per tool family), [`schema`] (every tool's input and output
//! types), [`error`] (tool failures and their stable codes), [`output`]
//! (structured content plus a short text rendering), [`progress`],
//! [`resources`] (workspaces as MCP resources), [`subscriptions`] (their
//! updates to subscribed clients), [`session`] (what a session owns), [`register`] (how to register
//! the server with MCP clients), [`host_roots`] (the host directories tools
//! may read and write), [`grants`] (what the operator allowed beyond that:
//! host changes, public ports).

#[cfg(feature = "conformance-fixture")]
pub mod conformance_fixture;
pub mod error;
pub mod grants;
pub mod host_roots;
pub mod http;
pub mod json_schema;
pub mod long_calls;
pub mod output;
pub mod progress;
pub mod register;
pub mod resources;
pub mod schema;
pub mod server;
pub mod session;
pub mod subscriptions;
pub mod tools;
pub mod uris;

use std::io::IsTerminal;
use std::time::Duration;

use rmcp::service::{QuitReason, ServerInitializeError};
use rmcp::ServiceExt;
use tokio::io::{AsyncRead, AsyncWrite};

pub use error::ToolError;
pub use grants::Grants;
pub use host_roots::{HostRoots, HostRootsError};
pub use server::MicroagentServer;

/// How long in-flight tool calls get to finish their cleanup (killing a
/// cancelled command, deleting a one-shot workspace) after the client went
/// away.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(60);

/// The longest JSON-RPC line the server reads: the largest `file_write`
/// in any encoding (JSON escapes a byte in at most six) with room for the
/// rest of the call.
pub const MAX_MESSAGE_BYTES: usize = 7 * schema::files::MAX_WRITE_BYTES;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The workspace store could not be opened.
    #[error("cannot open the workspace store: {}", .0.full_message())]
    Workspace(#[from] workspace::Error),
    /// An allowed host path is unusable.
    #[error(transparent)]
    HostRoots(#[from] HostRootsError),
    /// The MCP session could not be set up.
    #[error("MCP session setup failed: {0}")]
    Initialize(Box<ServerInitializeError>),
    /// The HTTP server could not run.
    #[error(transparent)]
    Http(#[from] http::HttpError),
    /// The session's task failed.
    #[error("the MCP session ended abnormally: {0}")]
    Session(#[from] tokio::task::JoinError),
}

/// `microagent serve mcp`: serves the workspaces `open` opens over
/// stdin/stdout until stdin closes, as agent `agent` when named. Started from a terminal it prints how to
/// register it with MCP clients (on stderr) and returns at once.
pub async fn serve_stdio(
    open: impl FnOnce() -> workspace::Result<workspace::Workspaces>,
    host_roots: HostRoots,
    grants: Grants,
    agent: Option<&str>,
) -> Result<(), McpError> {
    if std::io::stdin().is_terminal() {
        eprintln!("{}", register::instructions(&register::program()));
        return Ok(());
    }
    let mut server = MicroagentServer::new(open()?, host_roots).with_grants(grants);
    if let Some(name) = agent {
        server = server.with_agent(name)?;
    }
    let (stdin, stdout) = rmcp::transport::io::stdio_pipes();
    serve(server, stdin, stdout).await
}

/// Serves `server` over `reader`/`writer` until the reader ends, then gives
/// in-flight calls [`SHUTDOWN_GRACE`] to finish their cleanup.
pub async fn serve<R, W>(server: MicroagentServer, reader: R, writer: W) -> Result<(), McpError>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let inflight = server.inflight();
    let session = server.session();
    let subscriptions = server.subscriptions.clone();
    // rmcp drops a longer line without an answer (the call would hang):
    // every valid call fits, so a too-large file_write is answered with
    // INVALID_INPUT instead.
    let transport = rmcp::transport::async_rw::AsyncRwTransport::new_server(reader, writer)
        .with_max_line_length(MAX_MESSAGE_BYTES);
    let running = match server.serve(transport).await {
        Ok(running) => running,
        // The client went away before it said anything: a normal end.
        Err(ServerInitializeError::ConnectionClosed(why)) => {
            tracing::debug!(%why, "the client closed the connection before initializing");
            return Ok(());
        }
        Err(e) => return Err(McpError::Initialize(Box::new(e))),
    };
    let reason = running.waiting().await?;
    // Their guest watches stopped while the runtime still runs them.
    subscriptions.close().await;
    if let QuitReason::JoinError(e) = reason {
        return Err(e.into());
    }
    if !inflight.wait_idle(SHUTDOWN_GRACE).await {
        tracing::warn!(
            "tool calls still running {} s after the client went away; leaving them",
            SHUTDOWN_GRACE.as_secs()
        );
    }
    // The session is over: its session-scoped workspaces go.
    tokio::task::spawn_blocking(move || session.end()).await?;
    Ok(())
}

/// The name of the conformance suite's fixture tool, which only test
/// builds list (feature `conformance-fixture`).
pub const CONFORMANCE_FIXTURE_TOOL: &str = "json_schema_2020_12_tool";
