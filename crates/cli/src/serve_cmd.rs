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
        /// Let tools apply host changes with a preview's token
        /// (kernel_install, image_build from debian:*,
        /// host_networking_setup). Without it they preview only, and
        /// applying is FORBIDDEN: a client could confirm its own token.
        #[arg(long)]
        allow_host_changes: bool,
        /// Let port_publish listen on non-loopback host addresses
        /// (reachable from other machines). Without it: 127.0.0.1 or ::1.
        #[arg(long)]
        allow_public_ports: bool,
        /// A secret (from `microagent secret set`) tools may give commands
        /// as an environment variable (`secrets: [NAME]`); repeatable.
        /// Others are FORBIDDEN. Values never reach the client: output
        /// shows `***`.
        #[arg(long = "allow-secret", value_name = "NAME")]
        allow_secrets: Vec<String>,
    },
}

pub fn run(cmd: ServeCommand) -> ExitCode {
    match cmd {
        ServeCommand::Mcp {
            allow_host_paths,
            allow_host_changes,
            allow_public_ports,
            allow_secrets,
        } => {
            let mut grants = mcp::Grants::default()
                .host_changes(allow_host_changes)
                .public_ports(allow_public_ports);
            for name in allow_secrets {
                if let Err(e) = workspace::secrets::validate_secret_name(&name) {
                    eprintln!("microagent: error: --allow-secret: {e}");
                    return ExitCode::FAILURE;
                }
                grants = grants.allow_secret(name);
            }
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
            let served = runtime.block_on(mcp::serve_stdio(crate::open_workspaces, roots, grants));
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
