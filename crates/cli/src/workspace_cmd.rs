//! Life-cycle commands: create, start, stop, halt, delete, list, inspect, ttl.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use workspace::store::spec::defaults;
use workspace::{Error, ListFilter, Meta, State, WorkspaceSpec, Workspaces};

use crate::output::{self, age, key_value};

/// What `create` and `run` take to describe a workspace.
#[derive(Debug, Clone, Args)]
pub struct SpecArgs {
    /// Image: a registered one (see `microagent image ls`), or an OCI
    /// reference (python:3.12-alpine, 127.0.0.1:5000/team/tool:1), pulled
    /// first as --pull says and registered under its short name.
    #[arg(long, default_value = defaults::IMAGE)]
    pub image: String,
    /// When an --image reference is pulled: never (it must be pulled
    /// already), missing (when its name is not registered), always.
    #[arg(long, value_enum, value_name = "WHEN", default_value = "missing")]
    pub pull: PullArg,
    /// Number of vCPUs (default: the image's, else 1).
    #[arg(long, visible_alias = "cpus")]
    pub vcpus: Option<u8>,
    /// Guest memory in MiB, or with a unit (`512m`, `1g`; default: the
    /// image's, else 256).
    #[arg(long = "mem", short = 'm', visible_alias = "memory", value_name = "MIB", value_parser = crate::output::mib)]
    pub mem_mib: Option<u64>,
    /// Writable disk in MiB, or with a unit (`10g`; sparse: only what the
    /// guest writes uses host disk).
    #[arg(long = "disk", value_name = "MIB", default_value_t = defaults::DISK_MIB, value_parser = crate::output::mib)]
    pub disk_mib: u64,
    /// Environment variable for every command run in it (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE", value_parser = key_value)]
    pub env: Vec<(String, String)>,
    /// Label, for `list --label` (repeatable).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE", value_parser = key_value)]
    pub labels: Vec<(String, String)>,
    /// Stop it this long after each start: seconds or 30m, 1h, 2d.
    #[arg(long = "ttl", value_name = "DURATION", value_parser = parse_ttl)]
    pub ttl_secs: Option<u64>,
    /// Pause its vCPUs once it has had nothing to do (no command,
    /// connection, process or terminal) this long: 30s, 2m, 1h; 0 never
    /// (default: config.json's idle.pause_secs, else 2m). The next call,
    /// published-port connection or terminal resumes it.
    #[arg(long = "idle-pause", value_name = "DURATION", value_parser = parse_idle_pause)]
    pub idle_pause_secs: Option<u64>,
    /// Hibernate it once it has had nothing to do this long: its machine
    /// is written into its directory and its VMM ends (no memory, no CPU);
    /// the next call restores it as it was. 30m, 2h; 0 never (default:
    /// config.json's idle.hibernate_secs, else never).
    #[arg(long = "idle-hibernate", value_name = "DURATION", value_parser = parse_idle_hibernate)]
    pub idle_hibernate_secs: Option<u64>,
    /// Network: `user` (rootless NAT; the host's loopback is reachable as
    /// host.microagent.internal on the ports --allow host:PORT opens),
    /// `none`, or one from `network create`.
    #[arg(long, value_name = "NAME", default_value = workspace::store::name::DEFAULT_NETWORK)]
    pub network: String,
    /// Publish a port: connections to the host address reach
    /// 127.0.0.1:GUEST_PORT in the guest (repeatable; works without a
    /// network too).
    #[arg(long = "publish", short = 'p', value_name = "[HOST_IP:]HOST_PORT:GUEST_PORT", value_parser = crate::port_cmd::parse_mapping)]
    pub ports: Vec<workspace::store::ports::PortMapping>,
    /// What the guest may reach beyond the network: all (on `user`,
    /// everything but the host's loopback, link-local and private
    /// addresses), none, or allowlist (only the --allow rules). Default:
    /// the network's.
    #[arg(long, value_enum, value_name = "MODE")]
    pub egress: Option<crate::network_cmd::EgressArg>,
    /// A rule opening more (repeatable): a domain (pypi.org,
    /// *.pythonhosted.org), an address or CIDR with or without :PORT, or
    /// host:PORT (a port on the host's loopback, reached in the guest as
    /// host.microagent.internal:PORT).
    #[arg(long = "allow", value_name = "RULE", value_parser = crate::network_cmd::parse_allow)]
    pub allow: Vec<workspace::network::AllowEntry>,
    /// Mount a named volume (from `volume create`): NAME:/guest/path, or
    /// NAME:/guest/path:ro (repeatable, at most 4). Read-write to one
    /// running workspace at a time, read-only to any number.
    #[arg(long = "volume", short = 'v', value_name = "NAME:PATH[:ro]", value_parser = parse_volume)]
    pub volumes: Vec<workspace::store::volume_mounts::VolumeMount>,
    /// Clone an allowlisted repository (`repo allow`) into
    /// /workspace/repo, on branch task/WS (needs an image with git:
    /// debian). `repo pull WS` brings its commits back.
    #[arg(long, value_name = "ALIAS")]
    pub repo: Option<String>,
    /// The branch the clone starts from (default: the repository's
    /// current branch).
    #[arg(long, requires = "repo")]
    pub branch: Option<String>,
    /// A service beside it (repeatable, at most 8): a microVM of its own
    /// from IMAGE (a reference is pulled as --pull says), started,
    /// stopped and deleted with it, reached from it as NAME:PORT.
    /// `cmd=` comes last and takes the rest (run by sh -c; default: the
    /// image's command). Its output: `logs NAME --service SERVICE`.
    #[arg(long = "service", value_name = "NAME=IMAGE[,port=P][,env=K=V][,cmd=COMMAND]", value_parser = parse_service)]
    pub services: Vec<workspace::store::spec::services::ServiceSpec>,
}

fn parse_service(text: &str) -> Result<workspace::store::spec::services::ServiceSpec, String> {
    workspace::store::spec::services::parse_flag(text).map_err(|e| e.to_string())
}

fn parse_volume(text: &str) -> Result<workspace::store::volume_mounts::VolumeMount, String> {
    workspace::store::volume_mounts::VolumeMount::parse(text).map_err(|e| e.to_string())
}

/// `--pull`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PullArg {
    /// Never pull: the reference must be pulled already.
    Never,
    /// Pull when no image has its name.
    Missing,
    /// Pull every time.
    Always,
}

impl SpecArgs {
    /// The spec, its images pulled first when they are references
    /// (progress on stderr).
    pub async fn resolved_spec(&self, ws: &Workspaces) -> Result<WorkspaceSpec, Error> {
        use workspace::images::pull::{resolve, PullPolicy};
        let policy = match self.pull {
            PullArg::Never => PullPolicy::Never,
            PullArg::Missing => PullPolicy::Missing,
            PullArg::Always => PullPolicy::Always,
        };
        let shown = std::sync::Arc::new(std::sync::Mutex::new(crate::image_cmd::pull_progress(
            output::interactive(),
        )));
        let image = resolve(ws.image_registry(), &self.image, policy, shown.clone()).await?;
        // Checked before any of their images is pulled.
        workspace::store::spec::services::validate(&self.services)
            .map_err(|e| Error::InvalidInput(e.to_string()))?;
        let mut services = self.services.clone();
        for service in &mut services {
            service.image =
                resolve(ws.image_registry(), &service.image, policy, shown.clone()).await?;
        }
        // Sizes not given are the image's (the browser image asks more).
        let sized = ws.image_defaults(&image);
        Ok(WorkspaceSpec {
            image,
            vcpus: sized.vcpus_or(self.vcpus),
            mem_mib: sized.mem_mib_or(self.mem_mib),
            services,
            ..self.spec()
        })
    }

    /// On a terminal, offers to build a missing image of the library's
    /// own (`crate::first_need`); one with git when a repository is
    /// checked out.
    pub async fn build_missing_image(&self, ws: &Workspaces, json: bool) -> Result<(), Error> {
        use crate::first_need::{build_if_missing, Need};
        let need = if self.repo.is_some() {
            Need::Git
        } else {
            Need::Any
        };
        build_if_missing(ws, &self.image, need, json).await
    }

    pub fn spec(&self) -> WorkspaceSpec {
        WorkspaceSpec {
            image: self.image.clone(),
            vcpus: self.vcpus.unwrap_or(defaults::VCPUS),
            mem_mib: self.mem_mib.unwrap_or(defaults::MEM_MIB),
            disk_mib: self.disk_mib,
            env: self.env.iter().cloned().collect::<BTreeMap<_, _>>(),
            labels: self.labels.iter().cloned().collect::<BTreeMap<_, _>>(),
            ttl_secs: self.ttl_secs,
            idle_pause_secs: self.idle_pause_secs,
            idle_hibernate_secs: self.idle_hibernate_secs,
            network: self.network.clone(),
            ports: self.ports.clone(),
            egress: self.egress.map(crate::network_cmd::EgressArg::egress),
            allow: self.allow.clone(),
            volumes: self.volumes.clone(),
            repo: self.repo.as_ref().map(|alias| {
                workspace::store::repo_checkout::RepoCheckout::new(alias, self.branch.clone())
            }),
            services: self.services.clone(),
            ..WorkspaceSpec::default()
        }
    }
}

fn describe(meta: &Meta) {
    println!("{}", summary(meta));
}

/// One line about a workspace. Its strings may come from a server (a
/// workspace placed there): escaped, as guest text is.
fn summary(meta: &Meta) -> String {
    let s = &meta.spec;
    format!(
        "{}: {} ({} image, {} vCPU, {} MiB memory, {} MiB disk, network {}{}{})",
        output::field(&meta.name),
        state_text(meta),
        output::field(&s.image),
        s.vcpus,
        s.mem_mib,
        s.disk_mib,
        output::field(&s.network),
        s.ttl_secs
            .map(|t| format!(", ttl {t}s"))
            .unwrap_or_default(),
        if s.ports.is_empty() {
            String::new()
        } else {
            let ports: Vec<String> = s.ports.iter().map(ToString::to_string).collect();
            format!(", ports {}", ports.join(" "))
        }
    )
}

/// Its state, with why its vCPUs are stopped when they are: `running
/// (paused: idle)`.
fn state_text(meta: &Meta) -> String {
    match meta.runtime.as_ref().and_then(|r| r.paused) {
        Some(cause) if meta.state == State::Running => {
            format!("{} (paused: {})", meta.state, cause.name())
        }
        _ => meta.state.to_string(),
    }
}

/// `inspect`'s network line; its strings may come from a server.
fn network_line(n: &workspace::network::GuestNetwork) -> String {
    let a = &n.addressing;
    format!(
        "  network     {} ({} backend, egress {}): {}/{} via {}, dns {}, mac {}",
        output::field(&n.name),
        n.backend,
        n.egress,
        a.guest,
        a.prefix,
        a.gateway,
        a.dns,
        output::field(&n.mac)
    )
}

/// Runs `one` on each of `names` in turn. One name is that name's command
/// as it always was; with several, every one is tried: a failure is
/// reported (with `--json`, as its own `{"error": ...}` line among the
/// results' lines) and the next goes on, and the status is the first
/// failure's.
pub async fn each<F, Fut>(names: &[String], json: bool, mut one: F) -> Result<ExitCode, Error>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<ExitCode, Error>>,
{
    if let [name] = names {
        return one(name.clone()).await;
    }
    let mut first_failure = None;
    for name in names {
        let code = match one(name.clone()).await {
            Ok(code) => code,
            Err(e) => output::error(&e, json, output::FAILURE),
        };
        if code != ExitCode::SUCCESS {
            first_failure.get_or_insert(code);
        }
    }
    Ok(first_failure.unwrap_or(ExitCode::SUCCESS))
}

fn done(meta: &Meta, json: bool) -> ExitCode {
    if json {
        output::json(meta);
    } else {
        describe(meta);
    }
    ExitCode::SUCCESS
}

pub async fn create(
    ws: &Workspaces,
    name: &str,
    spec: &SpecArgs,
    json: bool,
) -> Result<ExitCode, Error> {
    // A bad or taken name fails before an image is built for it.
    if ws.workspace(name)?.get().is_err() {
        spec.build_missing_image(ws, json).await?;
    }
    let meta = ws.create(name, spec.resolved_spec(ws).await?)?;
    Ok(done(&meta, json))
}

/// Starts `name`, showing boot progress on a terminal.
pub async fn start_with_progress(
    ws: &Workspaces,
    name: &str,
    timeout: Duration,
    json: bool,
) -> Result<Meta, Error> {
    start_showing(ws, name, false, timeout, json).await
}

async fn start_showing(
    ws: &Workspaces,
    name: &str,
    cold: bool,
    timeout: Duration,
    json: bool,
) -> Result<Meta, Error> {
    let show = !json && output::interactive();
    let began = Instant::now();
    let report = |p: workspace::StartProgress| {
        if show {
            let console = p.console.unwrap_or_default();
            let line: String = output::field(&console).chars().take(60).collect();
            eprint!(
                "\r\x1b[2Kstarting {name}: {:>3} s  {line}",
                p.elapsed.as_secs()
            );
            let _ = std::io::stderr().flush();
        }
    };
    let meta = if cold {
        ws.workspace(name)?.start_cold(timeout, report).await
    } else {
        ws.workspace(name)?.start(timeout, report).await
    };
    if show {
        eprint!("\r\x1b[2K");
    }
    let meta = meta?;
    if !json {
        let how = meta
            .runtime
            .as_ref()
            .and_then(|r| r.start_kind)
            .map_or("", |k| k.name());
        eprintln!(
            "started {name} ({how}) in {:.1} s",
            began.elapsed().as_secs_f64()
        );
    }
    Ok(meta)
}

pub async fn start(
    ws: &Workspaces,
    name: &str,
    cold: bool,
    timeout: u64,
    json: bool,
) -> Result<ExitCode, Error> {
    let meta = start_showing(ws, name, cold, Duration::from_secs(timeout), json).await?;
    Ok(done(&meta, json))
}

pub async fn stop(
    ws: &Workspaces,
    name: &str,
    timeout: u64,
    json: bool,
) -> Result<ExitCode, Error> {
    let meta = ws
        .workspace(name)?
        .stop(Duration::from_secs(timeout))
        .await?;
    Ok(done(&meta, json))
}

pub async fn hibernate(
    ws: &Workspaces,
    name: &str,
    timeout: u64,
    json: bool,
) -> Result<ExitCode, Error> {
    let meta = ws
        .workspace(name)?
        .hibernate(Duration::from_secs(timeout))
        .await?;
    Ok(done(&meta, json))
}

/// Restores a hibernated workspace, or runs a paused one's vCPUs again.
pub async fn resume(ws: &Workspaces, name: &str, json: bool) -> Result<ExitCode, Error> {
    let dev = ws.workspace(name)?;
    let show = !json && output::interactive() && dev.get()?.state == State::Hibernated;
    if show {
        eprint!("resuming {name} from its hibernation...");
        let _ = std::io::stderr().flush();
    }
    let resumed = dev.resume().await;
    if show {
        eprintln!();
    }
    resumed?;
    Ok(done(&dev.get()?, json))
}

pub fn halt(ws: &Workspaces, name: &str, json: bool) -> Result<ExitCode, Error> {
    let meta = ws.workspace(name)?.halt()?;
    Ok(done(&meta, json))
}

pub fn delete(
    ws: &Workspaces,
    name: &str,
    yes: bool,
    force: bool,
    json: bool,
) -> Result<ExitCode, Error> {
    // Checked first, so a prompt is never shown for a missing workspace;
    // one placed on a server that does not know it (a create cut short)
    // goes on to the delete, which forgets it.
    let state = match ws.workspace(name)?.before_delete()? {
        Some(info) => info.meta.state.to_string(),
        None => "not on its server".to_owned(),
    };
    if !yes {
        if !std::io::stdin().is_terminal() || json {
            return Err(Error::InvalidInput(format!(
                "deleting `{name}` removes its disk; pass --yes to confirm"
            )));
        }
        eprint!("delete workspace {name} ({state}) and its disk? [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("not deleted");
            return Ok(ExitCode::from(output::FAILURE));
        }
    }
    let meta = ws
        .workspace(name)?
        .delete(workspace::DeleteOptions::default().force(force))?;
    if json {
        output::json(&serde_json::json!({ "deleted": meta.name, "was": meta.state }));
    } else {
        println!("deleted {}", output::field(&meta.name));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn list(ws: &Workspaces, filter: &ListFilter, json: bool) -> Result<ExitCode, Error> {
    let all = ws.list(filter)?;
    if json {
        output::json(&all);
        return Ok(ExitCode::SUCCESS);
    }
    let now = workspace::host::settings::now_ms();
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                output::owner(m.spec.agent.as_deref()),
                state_text(m),
                m.spec.image.clone(),
                m.spec.vcpus.to_string(),
                format!("{}M", m.spec.mem_mib),
                age(now.saturating_sub(m.created_at_ms)),
                m.runtime
                    .as_ref()
                    .map(|r| age(now.saturating_sub(r.started_at_ms)))
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    output::table(
        &[
            "NAME", "OWNER", "STATE", "IMAGE", "VCPUS", "MEM", "AGE", "UP",
        ],
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}

/// `metrics [NAME]`: one workspace's figures, or every workspace's.
pub async fn metrics(ws: &Workspaces, name: Option<&str>, json: bool) -> Result<ExitCode, Error> {
    let all = ws.metrics().figures(name).await?;
    if json {
        match name {
            Some(_) => output::json(&all.first()),
            None => output::json(&all),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mib = |b: u64| format!("{:.0}M", b as f64 / f64::from(1u32 << 20));
    let opt = |b: Option<u64>| b.map_or_else(|| "-".to_owned(), mib);
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                m.state.as_str().to_owned(),
                m.vcpus.to_string(),
                m.cpu_percent
                    .map_or_else(|| "-".to_owned(), |c| format!("{c:.0}%")),
                format!("{}/{}", opt(m.memory_used_bytes), opt(m.memory_total_bytes)),
                opt(m.host_rss_bytes),
                opt(m.balloon.map(|b| b.given_back_bytes)),
                opt(m.balloon.and_then(|b| b.guest_cache_bytes)),
                format!(
                    "{}/{}/{}",
                    opt(m.disk_used_bytes),
                    mib(m.disk_allocated_bytes),
                    mib(m.disk_size_bytes)
                ),
                m.uptime_secs
                    .map_or_else(|| "-".to_owned(), |s| age(s.saturating_mul(1000))),
                match (m.net_rx_bytes, m.net_tx_bytes) {
                    (Some(rx), Some(tx)) => format!("{}/{}", mib(rx), mib(tx)),
                    _ => "-".to_owned(),
                },
            ]
        })
        .collect();
    output::table(
        &[
            "NAME",
            "STATE",
            "VCPUS",
            "CPU",
            "MEM USED/TOTAL",
            "HOST RSS",
            "GIVEN BACK",
            "CACHE",
            "DISK USED/ALLOC/SIZE",
            "UP",
            "NET RX/TX",
        ],
        &rows,
    );
    Ok(ExitCode::SUCCESS)
}

pub fn inspect(ws: &Workspaces, name: &str, json: bool) -> Result<ExitCode, Error> {
    let info = ws.workspace(name)?.inspect()?;
    if json {
        output::json(&info);
        return Ok(ExitCode::SUCCESS);
    }
    describe(&info.meta);
    println!(
        "  directory   {}",
        output::field(&info.dir.display().to_string())
    );
    println!("  created     {} ago", age(info.age_ms));
    if let Some(rt) = &info.meta.runtime {
        println!("  vmm pid     {}", rt.pid);
        if !rt.protections.is_empty() {
            println!(
                "  confined    {}",
                output::field(&rt.protections.join(", "))
            );
        }
        println!("  up          {}", age(info.uptime_ms.unwrap_or(0)));
        if let (Some(kind), Some(us)) = (rt.start_kind, rt.ready_us) {
            let vcpu = rt
                .vcpu_running_us
                .map(|v| format!(" (vCPU running after {:.1} ms)", v as f64 / 1000.0))
                .unwrap_or_default();
            println!(
                "  started     {} in {:.1} ms{vcpu}",
                kind.name(),
                us as f64 / 1000.0
            );
        }
        if let Some(at) = rt.ttl_deadline_ms {
            let left = at.saturating_sub(workspace::host::settings::now_ms());
            println!("  ttl left    {}", age(left));
        }
        if let (Some(cause), Some(at)) = (rt.paused, rt.paused_at_ms) {
            let since = workspace::host::settings::now_ms().saturating_sub(at);
            println!("  paused      {} for {}", cause.name(), age(since));
        }
    }
    let now = workspace::host::settings::now_ms();
    if let Some(h) = &info.meta.hibernation {
        let ttl = h
            .ttl_left_ms
            .map(|left| format!("; ttl left {}", age(left)))
            .unwrap_or_default();
        println!(
            "  hibernated  {} for {}{ttl} (the next call resumes it)",
            output::field(&h.by),
            age(now.saturating_sub(h.at_ms))
        );
    }
    if info.meta.hibernated_ms > 0 {
        println!(
            "  hibernated  {} before this, in all",
            age(info.meta.hibernated_ms)
        );
    }
    println!("  disk used   {} KiB", info.disk_used_bytes / 1024);
    if let Some(n) = &info.network {
        println!("{}", network_line(n));
        if !n.allow.is_empty() {
            let rules: Vec<String> = n.allow.iter().map(ToString::to_string).collect();
            println!("  allow       {}", output::field(&rules.join(", ")));
        }
    }
    if let Some(refused) = &info.refused {
        println!("  refused     {} since it started", refused.denied);
        // Refusals name what the guest asked for; labels come from
        // clients; the last exit carries the guest's console.
        for r in &refused.denials {
            println!("    {}", output::field(&r.to_string()));
        }
    }
    for s in &info.services {
        let ports: Vec<String> = s.ports.iter().map(ToString::to_string).collect();
        println!(
            "  service     {} ({} image, {}, ports {}; {} in the guest)",
            output::field(&s.name),
            output::field(&s.image),
            output::field(&s.state),
            if ports.is_empty() {
                "none".to_owned()
            } else {
                ports.join(" ")
            },
            s.address
        );
    }
    for (k, v) in &info.meta.spec.labels {
        println!("  label       {}={}", output::field(k), output::field(v));
    }
    if let Some(exit) = &info.meta.last_exit {
        println!(
            "  last exit   {} ({} ago)",
            output::field(&exit.reason.to_string()),
            age(workspace::host::settings::now_ms().saturating_sub(exit.at_ms))
        );
        for line in &exit.console_tail {
            println!("    | {}", output::field(line));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn ttl(
    ws: &Workspaces,
    name: &str,
    ttl: &str,
    extend: bool,
    json: bool,
) -> Result<ExitCode, Error> {
    let secs = match ttl {
        "off" | "none" if extend => {
            return Err(Error::InvalidInput(
                "--extend takes a duration (30m, 1h, ...), not off".into(),
            ))
        }
        "off" | "none" => None,
        s => Some(workspace::store::spec::parse_duration(s)?),
    };
    let meta = match secs {
        Some(by) if extend => ws.workspace(name)?.extend_ttl(by)?,
        secs => ws.workspace(name)?.set_ttl(secs)?,
    };
    Ok(done(&meta, json))
}

fn parse_ttl(s: &str) -> Result<u64, String> {
    workspace::store::spec::parse_duration(s).map_err(|e| e.to_string())
}

fn parse_idle_pause(s: &str) -> Result<u64, String> {
    let secs = parse_ttl(s)?;
    workspace::host::idle::check_pause_secs(secs).map_err(|e| e.to_string())?;
    Ok(secs)
}

fn parse_idle_hibernate(s: &str) -> Result<u64, String> {
    let secs = parse_ttl(s)?;
    workspace::host::idle::check_hibernate_secs(secs).map_err(|e| e.to_string())?;
    Ok(secs)
}

/// Parses a `--state` filter.
pub fn parse_state(s: &str) -> Result<State, String> {
    State::ALL
        .into_iter()
        .find(|st| st.as_str() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
            format!("unknown state {s:?}; one of {}", names.join(", "))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_strings_reach_the_terminal_escaped() {
        // What a hostile server could answer for a workspace placed there:
        // OSC 52 (write the clipboard), a title, a screen clear.
        let mut spec = serde_json::to_value(workspace::WorkspaceSpec::default()).unwrap();
        spec["image"] = "debian\u{1b}[2J".into();
        spec["network"] = "user\u{1b}]0;owned\u{7}".into();
        let meta: Meta = serde_json::from_value(serde_json::json!({
            "name": "dev\u{1b}]52;c;aGk=\u{7}",
            "state": "running",
            "created_at_ms": 0,
            "spec": spec,
        }))
        .unwrap();
        let line = summary(&meta);
        assert!(
            !line.contains('\u{1b}') && !line.contains('\u{7}'),
            "{line:?}"
        );
        assert!(line.starts_with("dev"), "{line}");
        // inspect's network line: its name and MAC are the server's words.
        let net: workspace::network::GuestNetwork = serde_json::from_value(serde_json::json!({
            "name": "user\u{1b}]0;owned\u{7}",
            "backend": "user",
            "egress": "all",
            "guest": "10.0.2.15",
            "prefix": 24,
            "gateway": "10.0.2.2",
            "dns": "10.0.2.3",
            "mac": "\u{1b}]52;c;aGk=\u{7}",
        }))
        .unwrap();
        let line = network_line(&net);
        assert!(
            !line.contains('\u{1b}') && !line.contains('\u{7}'),
            "{line:?}"
        );
    }
}
