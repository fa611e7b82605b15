//! Commands on another server with `--server NAME` (a command on a
//! workspace that lives on one is a call of the workspace's handle, which
//! goes there by itself): the same command line runs there over SSH with
//! this terminal's stdin, stdout and stderr, and its exit status comes
//! back. So streaming, stdin, terminals and `--json` behave as they do
//! here.
//! What this host records follows what the remote confirmed: a create or
//! fork that succeeded there is placed, a delete forgets the placement.
//! `list` merges every server's workspaces.

use std::process::ExitCode;

use workspace::servers::{self, ServerSpec, LOCAL_SERVER};
use workspace::{ListFilter, Workspaces};

use crate::output;
use crate::Command;

/// What this host does once the remote command succeeded.
#[derive(Debug, PartialEq, Eq)]
enum Record {
    Nothing,
    Place(String),
    /// Forget the workspaces: their placements and their forwards.
    Forget(Vec<String>),
    /// Forward this host's 127.0.0.1:port to the server's `ip`:port.
    Forward(String, u16, std::net::IpAddr),
    /// End the forward of a port.
    Unforward(String, u16),
}

/// Where `cmd` runs: `None` here, else the server and what to record. A
/// create that names no server goes where [`servers::pick_server`] says
/// once servers are configured.
async fn route(
    ws: &Workspaces,
    cmd: &Command,
    server_flag: Option<&str>,
) -> workspace::Result<Option<(ServerSpec, Record)>> {
    let record = match cmd {
        Command::Create { name, .. } => Record::Place(name.clone()),
        Command::Fork { new_name, .. } => Record::Place(new_name.clone()),
        Command::Snapshot(crate::snapshot_cmd::SnapshotCommand::Restore {
            as_name: Some(new_name),
            ..
        }) => Record::Place(new_name.clone()),
        Command::Delete { names, .. } => Record::Forget(
            names
                .iter()
                .map(|n| full_name(ws, n))
                .collect::<workspace::Result<_>>()?,
        ),
        Command::Port(crate::port_cmd::PortCommand::Add {
            workspace,
            mapping,
            forward: true,
        }) => Record::Forward(
            full_name(ws, workspace)?,
            mapping.host_port,
            mapping.host_ip,
        ),
        Command::Port(crate::port_cmd::PortCommand::Rm {
            workspace,
            host: (_, port),
        }) => Record::Unforward(full_name(ws, workspace)?, *port),
        _ => Record::Nothing,
    };
    let server = match (server_flag, cmd) {
        (Some(server), _) => Some(server.to_owned()),
        (None, Command::Create { spec, .. }) if !ws.servers().list()?.is_empty() => {
            Some(ws.server_pool().pick_server(&spec.image).await?)
        }
        (None, _) => None,
    };
    // Whoever names the server, a workspace placed from here is checked
    // as its owner's before any ssh runs.
    for name in targets(cmd) {
        ws.placement_of(&full_name(ws, name)?)?;
    }
    match server {
        None => Ok(None),
        Some(s) if s == LOCAL_SERVER => Ok(None),
        Some(s) => {
            // One ssh call answers for all: which of several a failed
            // delete there removed would be unknown here.
            if matches!(&record, Record::Forget(names) if names.len() > 1) {
                return Err(workspace::Error::InvalidInput(
                    "delete workspaces on a server one at a time with --server (or without --server: each goes where it lives)".into(),
                ));
            }
            Ok(Some((ws.servers().get(&s)?, record)))
        }
    }
}

/// `name`'s full name (`NAME.NAMESPACE` outside the default namespace) in
/// this command's namespace: what placements are recorded under.
fn full_name(ws: &Workspaces, name: &str) -> workspace::Result<String> {
    Ok(ws.workspace(name)?.name().to_owned())
}

/// The workspaces `cmd` acts on.
fn targets(cmd: &Command) -> Vec<&str> {
    match cmd {
        Command::Start { names, .. }
        | Command::Stop { names, .. }
        | Command::Halt { names }
        | Command::Delete { names, .. } => names.iter().map(String::as_str).collect(),
        _ => target(cmd).into_iter().collect(),
    }
}

/// The workspace `cmd` acts on, when it names one (the commands that take
/// several are [`targets`]').
fn target(cmd: &Command) -> Option<&str> {
    use crate::browser_cmd::BrowserCommand as B;
    use crate::fs_cmd::FsCommand as F;
    use crate::port_cmd::PortCommand as P;
    use crate::process_cmd::ProcessCommand as Pr;
    use crate::snapshot_cmd::SnapshotCommand as S;
    Some(match cmd {
        Command::Hibernate { name, .. }
        | Command::Resume { name }
        | Command::Inspect { name }
        | Command::Ttl { name, .. }
        | Command::Exec { name, .. }
        | Command::Shell { name, .. }
        | Command::Ps { name }
        | Command::Logs { name, .. }
        | Command::Events { name, .. } => name,
        Command::Metrics { name } => name.as_deref()?,
        Command::Fork { workspace, .. } => workspace,
        Command::Process(
            Pr::Output { workspace, .. }
            | Pr::Wait { workspace, .. }
            | Pr::Signal { workspace, .. }
            | Pr::Stdin { workspace, .. }
            | Pr::Rm { workspace, .. },
        ) => workspace,
        Command::Fs(
            F::Stat { name, .. }
            | F::Mkdir { name, .. }
            | F::Rm { name, .. }
            | F::Mv { name, .. }
            | F::Edit { name, .. }
            | F::Find { name, .. },
        ) => name,
        Command::Snapshot(S::Take { workspace, .. }) => workspace,
        Command::Snapshot(S::Ls {
            workspace: Some(workspace),
        }) => workspace,
        Command::Port(P::Add { workspace, .. } | P::Ls { workspace } | P::Rm { workspace, .. }) => {
            workspace
        }
        Command::Browser(
            B::Open { workspace, .. }
            | B::Screenshot { workspace, .. }
            | B::Snapshot { workspace, .. }
            | B::Click { workspace, .. }
            | B::Fill { workspace, .. }
            | B::Close { workspace, .. }
            | B::Events { workspace, .. },
        ) => workspace,
        _ => return None,
    })
}

/// This process's arguments without the global `--server NAME` and
/// `--namespace NS` (before a `--`, after which they are the guest
/// command's).
fn forwarded_args() -> Vec<String> {
    forwarded(std::env::args().skip(1))
}

fn forwarded(mut args: impl Iterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(arg) = args.next() {
        if arg == "--" {
            out.push(arg);
            out.extend(args.by_ref());
            break;
        }
        // The namespace goes as one flag of its own (above).
        if arg == "--server" || arg == "--namespace" || arg == "-n" {
            args.next();
            continue;
        }
        if arg.starts_with("--namespace=") || (arg.starts_with("-n") && !arg.starts_with("--")) {
            continue;
        }
        // This host's own part of `port add`; the server publishes.
        if arg.starts_with("--server=") || arg == "--forward" {
            continue;
        }
        out.push(arg);
    }
    out
}

/// Runs `cmd` where it belongs when that is another server; `None` when
/// it runs here.
pub async fn forward_if_remote(
    ws: &Workspaces,
    cmd: &Command,
    server_flag: Option<&str>,
    json: bool,
) -> workspace::Result<Option<ExitCode>> {
    let Some((spec, record)) = route(ws, cmd, server_flag).await? else {
        return Ok(None);
    };
    let tty = matches!(cmd, Command::Shell { .. })
        || matches!(cmd, Command::Exec { args, .. } if args.tty);
    // `--server local` there: the remote runs it itself, never onward; in
    // this command's namespace, however it was given here (flag or
    // environment).
    let mut args = vec![
        "--server".to_owned(),
        LOCAL_SERVER.to_owned(),
        "--namespace".to_owned(),
        crate::namespace().to_owned(),
    ];
    args.extend(forwarded_args());
    // Placed before it is made, so nothing takes the name meanwhile; the
    // placement goes again unless the server made it. An interrupt here
    // ends ssh (it has the terminal too), not this process, so that is
    // still decided.
    let reservation = match &record {
        Record::Place(name) => {
            let full = ws.workspace(name)?.name().to_owned();
            Some(ws.reserve_placement(&spec.name, &full)?)
        }
        _ => None,
    };
    let _interrupts_reach_ssh_only = match &reservation {
        Some(_) => Some(
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                .map_err(|e| workspace::Error::from(servers::ServerError::Spawn(e)))?,
        ),
        None => None,
    };
    let status = run_there(ws, &spec, &args, tty)?;
    if let Some(reservation) = reservation.filter(|_| status == 0) {
        reservation.made();
    }
    if status == 0 {
        let servers = ws.servers();
        match record {
            Record::Place(_) => {}
            Record::Forget(names) => {
                for name in names {
                    // Only a placement on the server that deleted it: a
                    // namesake placed elsewhere stays.
                    let here = servers.placement(&name)?;
                    if here.is_some_and(|p| p.server == spec.name) {
                        servers.unforward_all(&name)?;
                        servers.unplace(&name)?;
                    }
                }
            }
            Record::Forward(name, port, ip) => {
                let ip = match ip {
                    ip if ip.is_unspecified() => "127.0.0.1".to_owned(),
                    std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                    std::net::IpAddr::V4(v4) => v4.to_string(),
                };
                servers.forward_port(&spec, &name, port, &ip)?;
                eprintln!(
                    "127.0.0.1:{port} here is forwarded to port {port} of server {}",
                    spec.name
                );
            }
            Record::Unforward(name, port) => {
                servers.unforward_port(&name, port)?;
            }
            Record::Nothing => {}
        }
    } else if status == servers::ssh::SSH_FAILED {
        // ssh's own failure (its message is above) cannot be told from a
        // command there that exited 255; say both.
        let message = format!(
            "server {} could not be reached or dropped the connection (ssh said why above), unless the command there exited 255; `microagent server status {}` shows whether it is reachable",
            spec.name, spec.name
        );
        return Ok(Some(output::report(
            workspace::ErrorCode::HostUnsupported,
            &message,
            json,
            255,
        )));
    }
    Ok(Some(ExitCode::from(
        u8::try_from(status).unwrap_or(output::FAILURE),
    )))
}

/// Runs `microagent ARGS` on `spec` with this process's stdio; its status.
pub fn run_there(
    ws: &Workspaces,
    spec: &ServerSpec,
    args: &[String],
    tty: bool,
) -> workspace::Result<i32> {
    let line = servers::ssh::remote_line(spec, args);
    let status = ws
        .servers()
        .ssh_command(spec, &line, tty)?
        .status()
        .map_err(|e| workspace::Error::from(servers::ServerError::Spawn(e)))?;
    Ok(status.code().unwrap_or(servers::ssh::SSH_FAILED))
}

/// `list` over every server: this host's workspaces, then each server's
/// (`SERVER` column; JSON entries gain `server`). An unreachable server's
/// placed workspaces are listed in state `unknown`.
pub async fn list_everywhere(
    ws: &Workspaces,
    filter: &ListFilter,
    json: bool,
) -> workspace::Result<ExitCode> {
    let specs = ws.servers().list()?;
    if specs.is_empty() {
        return crate::workspace_cmd::list(ws, filter, json);
    }
    let mut entries: Vec<serde_json::Value> = Vec::new();
    for meta in ws.list(filter)? {
        let mut v = serde_json::to_value(&meta).unwrap_or_default();
        v["server"] = LOCAL_SERVER.into();
        entries.push(v);
    }
    let mut args = vec!["list".to_owned()];
    if let Some(state) = filter.state {
        args.extend(["--state".to_owned(), state.to_string()]);
    }
    if let Some(image) = &filter.image {
        args.extend(["--image".to_owned(), image.clone()]);
    }
    for (k, v) in &filter.labels {
        args.extend(["--label".to_owned(), format!("{k}={v}")]);
    }
    if let Some(agent) = &filter.agent {
        args.extend(["--agent".to_owned(), agent.clone()]);
    }
    let placements = ws.servers().placements()?;
    for spec in &specs {
        let registry = ws.servers();
        match servers::run_remote_json(&registry, spec, &args, servers::DEFAULT_DEADLINE).await {
            Ok(serde_json::Value::Array(list)) => {
                for mut v in list {
                    v["server"] = spec.name.clone().into();
                    entries.push(v);
                }
            }
            Ok(_) | Err(_) => {
                for p in placements.iter().filter(|p| p.server == spec.name) {
                    entries.push(serde_json::json!({
                        "name": p.workspace, "server": spec.name, "state": "unknown",
                    }));
                }
            }
        }
    }
    if json {
        output::json(&entries);
        return Ok(ExitCode::SUCCESS);
    }
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_owned();
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                text(&e["name"]),
                text(&e["server"]),
                text(&e["state"]),
                text(&e["spec"]["image"]),
                e["spec"]["vcpus"]
                    .as_u64()
                    .map_or("-".into(), |n| n.to_string()),
                e["spec"]["mem_mib"]
                    .as_u64()
                    .map_or("-".into(), |n| format!("{n}M")),
            ]
        })
        .collect();
    output::table(&["NAME", "SERVER", "STATE", "IMAGE", "VCPUS", "MEM"], &rows);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> crate::Cli {
        crate::Cli::try_parse_from(args).unwrap()
    }

    #[test]
    fn workspace_commands_name_their_workspace() {
        for (args, want) in [
            (&["m", "exec", "dev", "--", "ls"][..], Some("dev")),
            (&["m", "fs", "stat", "dev", "/etc"], Some("dev")),
            (&["m", "process", "wait", "dev", "p1"], Some("dev")),
            (&["m", "snapshot", "take", "dev"], Some("dev")),
            (&["m", "fork", "dev", "dev2"], Some("dev")),
            (&["m", "metrics"], None),
            (&["m", "list"], None),
            (&["m", "image", "ls"], None),
        ] {
            assert_eq!(target(&parse(args).command), want, "{args:?}");
        }
        let args = |a: &[&str]| forwarded(a.iter().map(|s| s.to_string()));
        assert_eq!(
            args(&["-n", "team", "rm", "-y", "dev", "--server", "box"]),
            ["rm", "-y", "dev"]
        );
        assert_eq!(
            args(&[
                "--namespace=team",
                "exec",
                "dev",
                "-nteam",
                "--",
                "ls",
                "-n",
                "--server"
            ]),
            ["exec", "dev", "--", "ls", "-n", "--server"]
        );
        // Each workspace a command on several names acts on is checked.
        assert_eq!(
            targets(&parse(&["m", "rm", "-f", "a", "b"]).command),
            ["a", "b"]
        );
        assert_eq!(targets(&parse(&["m", "stop", "a"]).command), ["a"]);
        assert_eq!(targets(&parse(&["m", "inspect", "a"]).command), ["a"]);
        let cli = parse(&["m", "create", "dev", "--server", "box"]);
        assert_eq!(cli.server.as_deref(), Some("box"));
    }
}
