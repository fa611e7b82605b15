//! `microagent serve mcp`: the MCP server over stdin/stdout (see
//! docs/mcp.md). Stdout carries JSON-RPC only; logs go to stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum ServeCommand {
    /// Serve the workspaces as MCP tools over stdin/stdout until stdin
    /// closes. From a terminal, print how to register it with MCP clients.
    Mcp {
        /// A host directory the tools may copy from and to (copy_in,
        /// copy_out, image_import); repeatable. Default: the server's working
        /// directory, the project the client started it for. Paths outside
        /// every such directory, also through symlinks, are FORBIDDEN.
        #[arg(long = "allow-host-path", value_name = "DIR")]
        allow_host_paths: Vec<PathBuf>,
    },
}

pub fn run(cmd: ServeCommand) -> ExitCode {
    match cmd {
        ServeCommand::Mcp { allow_host_paths } => {
            let dirs = if allow_host_paths.is_empty() {
                match std::env::current_dir() {
                    Ok(cwd) => vec![cwd],
                    Err(e) => {
                        eprintln!("microagent: error: cannot find the working directory ({e}); pass --allow-host-path DIR");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                allow_host_paths
            };
            let roots = match mcp::HostRoots::new(&dirs) {
                Ok(roots) => roots,
                Err(e) => {
                    eprintln!(
                        "microagent: error: {}; pass existing directories to --allow-host-path",
                        workspace::error_chain(&e)
                    );
                    return ExitCode::FAILURE;
                }
            };
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
            let served = runtime.block_on(mcp::serve_stdio(crate::open_workspaces, roots));
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
