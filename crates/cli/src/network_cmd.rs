//! `microagent network create | ls | inspect | rm | setup | teardown`.

use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};
use workspace::network::{AllowEntry, Backend, Egress, NetworkRequest, Subnet};
use workspace::{network::setup::HostChange, network::NetworkInfo, Error, Workspaces};

use crate::output;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BackendArg {
    /// Rootless NAT through passt (no host setup).
    User,
    /// A bridge with nftables egress rules (needs `network setup`, as root).
    Tap,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum EgressArg {
    /// Anything the host reaches (on `user`: but the host's loopback,
    /// link-local and private addresses, unless --allow opens them).
    All,
    /// Nothing.
    None,
    /// Only what the --allow rules name.
    Allowlist,
}

impl EgressArg {
    pub fn egress(self) -> Egress {
        match self {
            EgressArg::All => Egress::All,
            EgressArg::None => Egress::None,
            EgressArg::Allowlist => Egress::Allowlist,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum NetworkCommand {
    /// Create a network (`create --network NAME` puts workspaces on it).
    Create {
        /// Network name.
        name: String,
        /// `user` (rootless, default) or `tap` (egress rules; needs host setup).
        #[arg(long, value_enum, default_value = "user")]
        backend: BackendArg,
        /// Subnet, e.g. 10.89.5.0/24 (default: 10.0.2.0/24 for user, a free
        /// 10.89.N.0/24 for tap).
        #[arg(long, value_parser = parse_subnet)]
        subnet: Option<Subnet>,
        /// What guests may reach: all (default; on `user`, all but the
        /// host's loopback, link-local and private addresses), none or
        /// allowlist.
        #[arg(long, value_enum, default_value = "all")]
        egress: EgressArg,
        /// A rule (repeatable): a domain (it and names under it; *.domain:
        /// only those under it), an address or CIDR, and on `user` also
        /// with :PORT, or host:PORT.
        #[arg(long = "allow", value_name = "RULE", value_parser = parse_allow)]
        allow: Vec<AllowEntry>,
        /// Let guests of this tap network reach each other (by default
        /// each one's bridge port is isolated).
        #[arg(long)]
        allow_peers: bool,
    },
    /// Show a workspace's egress policy and what it refused; with
    /// --egress or --allow, change it (at once for new connections when it
    /// runs, and for every start).
    Policy {
        /// Workspace name.
        workspace: String,
        /// Its mode: all, none or allowlist (default: the network's).
        #[arg(long, value_enum)]
        egress: Option<EgressArg>,
        /// Its rules, replacing the ones it had (repeatable): a domain
        /// (pypi.org, *.pythonhosted.org), an address or CIDR with or
        /// without :PORT, or host:PORT.
        #[arg(long = "allow", value_name = "RULE", value_parser = parse_allow)]
        allow: Vec<AllowEntry>,
        /// Remove its own rules (the network's stay).
        #[arg(long, conflicts_with = "allow")]
        no_allow: bool,
    },
    /// List networks and the workspaces on each.
    #[command(visible_alias = "list")]
    Ls,
    /// Show one network.
    Inspect {
        /// Network name.
        name: String,
    },
    /// Remove a network no workspace uses.
    #[command(visible_aliases = ["remove", "delete"])]
    Rm {
        /// Network name.
        name: String,
    },
    /// Show the host changes the tap networks need (bridges, nftables,
    /// resolvers); apply them with the printed --confirm token, as root.
    Setup {
        /// The token of a preview: apply exactly that plan.
        #[arg(long, value_name = "TOKEN")]
        confirm: Option<String>,
    },
    /// Show how to remove everything setup made; apply with --confirm.
    Teardown {
        /// The token of a preview: apply exactly that plan.
        #[arg(long, value_name = "TOKEN")]
        confirm: Option<String>,
    },
}

fn parse_subnet(s: &str) -> Result<Subnet, String> {
    s.parse()
}

pub fn parse_allow(s: &str) -> Result<AllowEntry, String> {
    s.parse()
}

fn describe(n: &NetworkInfo) -> Vec<String> {
    let net = &n.network;
    vec![
        net.name.clone(),
        net.backend.map_or("-".into(), |b| b.to_string()),
        net.subnet.map_or("-".into(), |s| s.to_string()),
        net.egress.to_string(),
        if n.workspaces.is_empty() {
            "-".into()
        } else {
            n.workspaces.join(",")
        },
    ]
}

fn print_one(n: &NetworkInfo, json: bool) {
    if json {
        return output::json(n);
    }
    let net = &n.network;
    println!("name:       {}", net.name);
    println!(
        "backend:    {}",
        net.backend
            .map_or("none (no device)".into(), |b| b.to_string())
    );
    if let Some(s) = net.subnet {
        println!("subnet:     {s}");
    }
    if let Some(g) = n.gateway {
        println!("gateway:    {g} (host.microagent.internal)");
    }
    if let Some(b) = &n.bridge {
        println!("bridge:     {b}");
    }
    println!("egress:     {}", net.egress);
    if !net.allow.is_empty() {
        let allow: Vec<String> = net.allow.iter().map(ToString::to_string).collect();
        println!("allow:      {}", output::field(&allow.join(", ")));
    }
    println!(
        "workspaces: {}",
        if n.workspaces.is_empty() {
            "none".into()
        } else {
            n.workspaces.join(", ")
        }
    );
}

/// `network policy WS [...]`: changes what was asked, then shows the
/// policy in force and the refusals.
fn policy(
    ws: &Workspaces,
    name: &str,
    egress: Option<EgressArg>,
    allow: &[AllowEntry],
    no_allow: bool,
    json: bool,
) -> Result<(), Error> {
    let handle = ws.workspace(name)?;
    if egress.is_some() || !allow.is_empty() || no_allow {
        let meta = handle.get()?;
        let mode = egress.map(EgressArg::egress).or(meta.spec.egress);
        let rules = if allow.is_empty() && !no_allow {
            meta.spec.allow.clone()
        } else {
            allow.to_vec()
        };
        handle.egress().set(mode, rules)?;
    }
    let info = handle.inspect()?;
    let denials = info.refused.as_ref();
    let network = info.network.as_ref();
    if json {
        output::json(&serde_json::json!({
            "workspace": name,
            "egress": network.map(|n| n.egress),
            "allow": network.map(|n| &n.allow),
            "denied": denials.map(|d| d.denied),
            "denials": denials.map(|d| &d.denials),
        }));
        return Ok(());
    }
    let Some(network) = network else {
        println!("{name}: no network (egress: nothing)");
        return Ok(());
    };
    println!("workspace: {name} (network {})", network.name);
    println!("egress:    {}", network.egress);
    let rules: Vec<String> = network.allow.iter().map(ToString::to_string).collect();
    println!(
        "allow:     {}",
        if rules.is_empty() {
            "-".into()
        } else {
            output::field(&rules.join(", ")).into_owned()
        }
    );
    match denials {
        Some(d) => {
            println!("refused:   {} since it started", d.denied);
            // A refusal names what the guest asked for (a DNS name).
            for r in &d.denials {
                println!("  {}", output::field(&r.to_string()));
            }
        }
        None => println!("refused:   (shown while it runs on the user network)"),
    }
    Ok(())
}

fn print_change(change: &HostChange, command: &str, json: bool) {
    if json {
        return output::json(change);
    }
    crate::plan_out::print(
        &change.preview,
        change.applied,
        Some(&format!("microagent network {command}")),
    );
}

pub fn run(ws: &Workspaces, cmd: &NetworkCommand, json: bool) -> Result<ExitCode, Error> {
    match cmd {
        NetworkCommand::Create {
            name,
            backend,
            subnet,
            egress,
            allow,
            allow_peers,
        } => {
            let req = NetworkRequest {
                backend: match backend {
                    BackendArg::User => Backend::User,
                    BackendArg::Tap => Backend::Tap,
                },
                subnet: *subnet,
                egress: egress.egress(),
                allow: allow.clone(),
                allow_peers: *allow_peers,
            };
            let info = ws.networks().create(name, &req)?;
            print_one(&info, json);
            if !json && req.backend == Backend::Tap {
                eprintln!(
                    "next: `microagent network setup` shows the host changes this network needs"
                );
            }
        }
        NetworkCommand::Policy {
            workspace,
            egress,
            allow,
            no_allow,
        } => policy(ws, workspace, *egress, allow, *no_allow, json)?,
        NetworkCommand::Ls => {
            let all = ws.networks().list()?;
            if json {
                output::json(&all);
            } else {
                let rows: Vec<Vec<String>> = all.iter().map(describe).collect();
                output::table(
                    &["NAME", "BACKEND", "SUBNET", "EGRESS", "WORKSPACES"],
                    &rows,
                );
            }
        }
        NetworkCommand::Inspect { name } => print_one(&ws.networks().inspect(name)?, json),
        NetworkCommand::Rm { name } => {
            let info = ws.networks().delete(name, false)?;
            if json {
                output::json(&info);
            } else {
                println!("removed network {name}");
            }
        }
        NetworkCommand::Setup { confirm } => {
            print_change(&ws.networks().setup(confirm.as_deref())?, "setup", json);
        }
        NetworkCommand::Teardown { confirm } => {
            print_change(
                &ws.networks().teardown(confirm.as_deref())?,
                "teardown",
                json,
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
