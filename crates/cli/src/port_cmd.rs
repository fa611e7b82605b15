//! `microagent port add | ls | rm`: a workspace's published ports; `port
//! preview | previews | unpreview`: its preview URLs.

use std::net::IpAddr;
use std::process::ExitCode;

use clap::Subcommand;
use serde::Serialize;
use workspace::store::ports::PortMapping;
use workspace::{Error, Workspaces};

use crate::output;

#[derive(Debug, Subcommand)]
pub enum PortCommand {
    /// Publish a port: connections to the host address reach
    /// 127.0.0.1:GUEST_PORT in the guest (at once if it runs, and at every
    /// start).
    Add {
        /// Workspace name.
        workspace: String,
        /// `[HOST_IP:]HOST_PORT:GUEST_PORT` (host address 127.0.0.1 unless given).
        #[arg(value_parser = parse_mapping)]
        mapping: PortMapping,
        /// For a workspace on another server: also forward this host's
        /// 127.0.0.1:HOST_PORT to it over SSH (until `port rm` or delete).
        #[arg(long)]
        forward: bool,
    },
    /// List a workspace's published ports.
    #[command(visible_alias = "list")]
    Ls {
        /// Workspace name.
        workspace: String,
    },
    /// Stop publishing a host port (open connections run on).
    #[command(visible_aliases = ["remove", "delete"])]
    Rm {
        /// Workspace name.
        workspace: String,
        /// `[HOST_IP:]HOST_PORT` (host address 127.0.0.1 unless given).
        #[arg(value_parser = parse_host_port)]
        host: (IpAddr, u16),
    },
    /// Make a preview URL of a guest port: `/preview/<token>/` on the
    /// address of `microagent serve mcp --http` for this state directory
    /// reaches the web app on GUEST_PORT, HTTP and WebSocket, until it
    /// expires or is revoked. The token is printed once.
    Preview {
        /// Workspace name.
        workspace: String,
        /// The guest port the web app listens on.
        guest_port: u16,
        /// How long it works: 90, 30m, 2h, 7d (default 24h, at most 30d).
        #[arg(long, value_parser = parse_expires)]
        expires: Option<u64>,
    },
    /// List a workspace's live preview URLs (their tokens are not kept).
    Previews {
        /// Workspace name.
        workspace: String,
    },
    /// Revoke a workspace's preview URLs of GUEST_PORT (all of them when
    /// left out): they answer 404 from now on.
    Unpreview {
        /// Workspace name.
        workspace: String,
        /// The guest port.
        guest_port: Option<u16>,
    },
}

fn parse_expires(s: &str) -> Result<u64, String> {
    workspace::store::spec::parse_duration(s).map_err(|e| e.to_string())
}

/// Parses `[HOST_IP:]HOST_PORT:GUEST_PORT`.
pub fn parse_mapping(s: &str) -> Result<PortMapping, String> {
    s.parse::<PortMapping>().map_err(|e| e.to_string())
}

fn parse_host_port(s: &str) -> Result<(IpAddr, u16), String> {
    workspace::store::ports::parse_host_addr(s)
        .ok_or_else(|| format!("{s:?}: use [HOST_IP:]HOST_PORT, e.g. 8080 or 127.0.0.1:8080"))
}

#[derive(Serialize)]
struct Ports<'a> {
    workspace: &'a str,
    ports: &'a [PortMapping],
}

fn print(workspace: &str, ports: &[PortMapping], json: bool) {
    if json {
        output::json(&Ports { workspace, ports });
    } else if ports.is_empty() {
        println!("{workspace} publishes no ports");
    } else {
        for p in ports {
            println!(
                "{} -> {workspace}:127.0.0.1:{}",
                p.host_addr(),
                p.guest_port
            );
        }
    }
}

pub fn run(ws: &Workspaces, cmd: &PortCommand, json: bool) -> Result<ExitCode, Error> {
    match cmd {
        PortCommand::Add {
            workspace,
            mapping,
            forward,
        } => {
            let dev = ws.workspace(workspace)?;
            let remote = dev.remote()?;
            if *forward && remote.is_none() {
                return Err(workspace::Error::InvalidInput(format!(
                    "--forward is for a workspace on another server; {workspace} is on this host, so its port is published here already"
                )));
            }
            let meta = dev.ports().publish(*mapping)?;
            print(workspace, &meta.spec.ports, json);
            if let Some(remote) = remote.filter(|_| *forward) {
                remote.forward_port(mapping)?;
                let port = mapping.host_port;
                eprintln!(
                    "127.0.0.1:{port} here is forwarded to port {port} of server {}",
                    remote.server()
                );
            }
        }
        PortCommand::Ls { workspace } => {
            let meta = ws.workspace(workspace)?.get()?;
            print(workspace, &meta.spec.ports, json);
        }
        PortCommand::Rm {
            workspace,
            host: (ip, port),
        } => {
            let meta = ws.workspace(workspace)?.ports().unpublish(*ip, *port)?;
            print(workspace, &meta.spec.ports, json);
        }
        PortCommand::Preview {
            workspace,
            guest_port,
            expires,
        } => {
            let ttl = expires.map(std::time::Duration::from_secs);
            let made = ws
                .workspace(workspace)?
                .previews()
                .create(*guest_port, ttl)?;
            if json {
                output::json(&made);
            } else {
                println!("{}", made.path);
                eprintln!(
                    "reaches {workspace}'s port {guest_port} until {} (Unix ms) at http://{}.localhost:PORT{} (its own origin) of `microagent serve preview 127.0.0.1:PORT` or `serve mcp --http 127.0.0.1:PORT`, or at http://127.0.0.1:PORT{2} sandboxed; revoke with `microagent port unpreview {workspace} {guest_port}`",
                    made.record.expires_at_ms, made.origin_label, made.path
                );
            }
        }
        PortCommand::Previews { workspace } => {
            let live = ws.workspace(workspace)?.previews().list()?;
            if json {
                output::json(&serde_json::json!({"workspace": workspace, "previews": live}));
            } else if live.is_empty() {
                println!("{workspace} has no preview URLs");
            } else {
                for p in &live {
                    let line = workspace::store::previews::describe(
                        p.port,
                        p.expires_at_ms,
                        p.agent.as_deref(),
                    );
                    println!("{line}");
                }
            }
        }
        PortCommand::Unpreview {
            workspace,
            guest_port,
        } => {
            let revoked = ws.workspace(workspace)?.previews().revoke(*guest_port)?;
            if json {
                output::json(&serde_json::json!({"workspace": workspace, "revoked": revoked}));
            } else {
                println!("revoked {revoked} preview URL(s) of {workspace}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use workspace::store::ports::DEFAULT_HOST_IP;

    #[test]
    fn host_ports_parse() {
        assert_eq!(parse_host_port("8080").unwrap(), (DEFAULT_HOST_IP, 8080));
        assert_eq!(
            parse_host_port("0.0.0.0:8080").unwrap(),
            ("0.0.0.0".parse().unwrap(), 8080)
        );
        assert_eq!(
            parse_host_port("[::1]:8080").unwrap(),
            ("::1".parse().unwrap(), 8080)
        );
        for bad in ["", "x", "1.2.3:80", "70000"] {
            assert!(parse_host_port(bad).is_err(), "{bad}");
        }
    }
}
