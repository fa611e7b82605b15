//! `microagent serve mcp`: the MCP server over stdin/stdout (see
//! docs/mcp.md). Stdout carries JSON-RPC only; logs go to stderr.

use std::process::ExitCode;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ServeCommand {
    /// Serve the workspaces as MCP tools over stdin/stdout until stdin
    /// closes. From a terminal, print how to register it with MCP clients.
    Mcp,
}

pub fn run(cmd: ServeCommand) -> ExitCode {
    match cmd {
        ServeCommand::Mcp => {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("microagent: error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let served = runtime.block_on(mcp::serve_stdio(crate::open_workspaces));
            // Tool calls still running past the shutdown grace are not
            // waited for.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("microagent: error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
