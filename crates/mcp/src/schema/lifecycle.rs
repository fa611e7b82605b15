//! Inputs and outputs of the life-cycle tools: create, start, stop, halt,
//! delete, list, inspect, logs, events.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::{Event, EventKind};
use workspace::{Meta, State, WorkspaceInfo};

use crate::output::Render;
use workspace::guest::copy::human_bytes;

/// Default seconds `workspace_start` waits for the boot.
pub const DEFAULT_START_TIMEOUT_SECS: u64 = 300;
/// Longest `workspace_start` wait.
pub const MAX_START_TIMEOUT_SECS: u64 = 3600;
/// Default seconds `workspace_stop` gives the guest.
pub const DEFAULT_STOP_TIMEOUT_SECS: u64 = 30;
/// Longest `workspace_stop` grace period.
pub const MAX_STOP_TIMEOUT_SECS: u64 = 600;
/// Default console lines of `workspace_logs`.
pub const DEFAULT_LOG_LINES: usize = 100;
/// Most console lines of one `workspace_logs` call.
pub const MAX_LOG_LINES: usize = 5000;

/// `workspace_create`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateParams {
    /// Workspace name: 1-63 of a-z, 0-9 and '-', starting with a letter and
    /// not ending with '-'.
    pub name: String,
    /// The namespace it goes in (default: the session's). Elsewhere its
    /// full name `name.namespace` reaches it from any namespace.
    pub namespace: Option<String>,
    /// Image to boot (see `image_list`); default `minimal` (busybox). Use
    /// `debian` for Python, apt and a full userland. An OCI reference
    /// (`python:3.12-alpine`, `127.0.0.1:5000/team/tool:1`) is pulled
    /// first as `pull` says and registered under its short name.
    pub image: Option<String>,
    /// When an `image` reference is pulled: `never` (it must be pulled
    /// already), `missing` (default: when its name is not registered),
    /// `always`.
    pub pull: Option<workspace::images::pull::PullPolicy>,
    /// vCPUs, 1 to 8; default: the image's (`browser` 2), else 1.
    #[schemars(range(min = 1, max = workspace::LIMITS.max_vcpus))]
    pub vcpus: Option<u32>,
    /// Guest memory in MiB, 64 to 16384, or with a unit (`"512m"`, `"2g"`);
    /// default: the image's (`browser` 2048, `debian` 512), else 256.
    #[serde(default, deserialize_with = "workspace::sizes::optional_mib")]
    #[schemars(schema_with = "workspace::sizes::mem_schema")]
    pub mem_mib: Option<u64>,
    /// Writable disk in MiB, 64 to 1048576, or with a unit (`"10g"`);
    /// default 1024. Sparse: only what the guest writes uses host disk.
    #[serde(default, deserialize_with = "workspace::sizes::optional_mib")]
    #[schemars(schema_with = "workspace::sizes::disk_schema")]
    pub disk_mib: Option<u64>,
    /// Environment variables added to every command run in it (at most 64;
    /// keys of letters, digits and _ . - /).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free-form labels for `workspace_list` filters (at most 64).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Stop it this many seconds after each start (1 to 2592000); default:
    /// no TTL.
    #[schemars(range(min = 1, max = workspace::LIMITS.max_ttl_secs))]
    pub ttl_secs: Option<u64>,
    /// The same as a duration: "90s", "30m", "1h", "1h30m", "2d" (give
    /// this or ttl_secs).
    pub ttl: Option<String>,
    /// Pause its vCPUs after this many seconds with nothing to do (no
    /// call, connection, process or terminal): 0 never, else 5 to 604800;
    /// default: the server's setting, else 120. Any call resumes it first
    /// (the caller sees only the latency).
    #[schemars(range(min = 0, max = workspace::host::idle::MAX_PAUSE_SECS))]
    pub idle_pause_secs: Option<u64>,
    /// Hibernate it after this many seconds with nothing to do: its
    /// machine is written into its directory and its VMM ends (no memory,
    /// no CPU); any call restores it as it was. 0 never, else 5 to 604800;
    /// default: the server's setting, else never. Not for a workspace
    /// with services.
    #[schemars(range(min = 0, max = workspace::host::idle::MAX_PAUSE_SECS))]
    pub idle_hibernate_secs: Option<u64>,
    /// Network: "user" (rootless NAT through the host) or "none"; default
    /// "user".
    pub network: Option<String>,
    /// What the guest may reach beyond the network: "all" (on "user":
    /// everything but the host's loopback, link-local and private
    /// addresses), "none", or "allowlist" (only what `allow` names);
    /// default: the network's.
    pub egress: Option<workspace::network::Egress>,
    /// Rules opening more than the mode (at most 256): a domain
    /// ("pypi.org": it and the names under it; "*.pythonhosted.org": only
    /// the names under it), an IPv4 address or CIDR with or without
    /// ":PORT", or "host:PORT" (a port on the host's loopback, reached in
    /// the guest as host.microagent.internal:PORT).
    #[serde(default)]
    pub allow: Vec<workspace::network::AllowEntry>,
    /// Published ports: each {host_port, guest_port[, host_ip]} makes TCP
    /// connections to the host address (default 127.0.0.1) reach
    /// 127.0.0.1:guest_port in the guest (at most 32; a host port in use
    /// is refused with CONFLICT; a non-loopback host_ip is FORBIDDEN
    /// unless the server was started with --allow-public-ports).
    #[serde(default)]
    pub ports: Vec<workspace::store::ports::PortMapping>,
    /// Named volumes to mount (at most 4): each {name, path[, read_only]}.
    /// A read-write volume held by another running workspace is CONFLICT.
    #[serde(default)]
    pub volumes: Vec<crate::schema::volumes::VolumeParam>,
    /// An allowlisted repository's alias (list_repos): a full clone goes to
    /// /workspace/repo on branch `task/<name>` at the first start (needs an
    /// image with git: "debian"). Anything not allowlisted is FORBIDDEN.
    #[serde(default)]
    pub repo: Option<String>,
    /// The branch the clone starts from (default: the repository's current
    /// branch); only with `repo`.
    #[serde(default)]
    pub branch: Option<String>,
    /// Delete the workspace when this MCP session ends (stdin closed, the
    /// HTTP session closed or expired, or this server gone). Default false:
    /// workspaces outlive sessions.
    #[serde(default)]
    pub session_scoped: bool,
    /// The server it goes on (see `server_list`). Default: where there is
    /// most room once servers are configured (a workspace with ports,
    /// volumes, a repository, egress rules or session_scoped stays on this
    /// host), else this host (`local`). Every later call on it runs there.
    #[serde(default)]
    pub server: Option<String>,
    /// Start it too, and answer once its agent answers (default false:
    /// created stopped).
    #[serde(default)]
    pub start: bool,
    /// Sidecars (at most 8), such as redis or postgres: each a microVM of
    /// its own from `image` (a reference is pulled as `pull` says) with no
    /// network, started, stopped and deleted with the workspace, reached
    /// from it as `name:port` (`name` resolves in its guest). Its output:
    /// `workspace_logs` with `service`. A workspace with services stays on
    /// this host.
    #[serde(default)]
    #[schemars(length(max = workspace::store::spec::services::MAX_SERVICES))]
    pub services: Vec<ServiceParam>,
}

/// One of `workspace_create`'s `services`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceParam {
    /// The host name the workspace reaches it by: 1-40 of a-z, 0-9 and
    /// '-', starting with a letter (not `localhost`).
    pub name: String,
    /// Its image: a registered one or an OCI reference (`redis:7`).
    pub image: String,
    /// Its command: a string run by `sh -c`, or a program and its
    /// arguments; default: the image's command.
    pub command: Option<ServiceCommand>,
    /// Environment variables of its command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The ports the workspace reaches it on (at most 8; 32 over all
    /// services).
    #[serde(default)]
    pub ports: Vec<u16>,
}

/// A service's command.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ServiceCommand {
    /// Run by `sh -c`.
    Shell(String),
    /// A program and its arguments, without a shell.
    Argv(Vec<String>),
}

impl ServiceParam {
    /// The service as the library takes it (its image as given).
    pub fn spec(self) -> workspace::store::spec::services::ServiceSpec {
        workspace::store::spec::services::ServiceSpec {
            name: self.name,
            image: self.image,
            command: match self.command {
                None => Vec::new(),
                Some(ServiceCommand::Shell(line)) => vec!["sh".into(), "-c".into(), line],
                Some(ServiceCommand::Argv(argv)) => argv,
            },
            env: self.env,
            ports: self.ports,
        }
    }
}

/// Inputs that only name a workspace.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NameParams {
    /// Workspace name.
    pub name: String,
}

/// `workspace_extend_ttl`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendTtlParams {
    /// Workspace name.
    pub name: String,
    /// Add this much: "30m", "1h", "1h30m", "2d" or seconds ("90"). A
    /// running workspace's deadline moves that much later, and later
    /// starts get a TTL that much longer. Default (neither this nor
    /// `ttl_secs`): "1h".
    pub by: Option<String>,
    /// Or set the TTL to this many seconds (from now if it runs, and for
    /// every later start). Give `by` or `ttl_secs`.
    #[schemars(range(min = 1, max = workspace::LIMITS.max_ttl_secs))]
    pub ttl_secs: Option<u64>,
}

/// `workspace_start`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartParams {
    /// Workspace name (stopped or crashed).
    pub name: String,
    /// Seconds to wait for the guest agent to answer, 1 to 3600; default
    /// 300. On timeout the VM is halted.
    #[schemars(range(min = 1, max = MAX_START_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// Boot the kernel even when the image's warm snapshot could be used (a
    /// never-started workspace otherwise resumes it in about a second).
    #[serde(default)]
    pub cold: bool,
}

/// `workspace_stop`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopParams {
    /// Workspace name.
    pub name: String,
    /// Seconds the guest gets to shut down cleanly before the VM is torn
    /// down, 1 to 600; default 30.
    #[schemars(range(min = 1, max = MAX_STOP_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `workspace_hibernate`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HibernateParams {
    /// Workspace name.
    pub name: String,
    /// Seconds the machine may take to be written, 1 to 600; default 120.
    #[schemars(range(min = 1, max = MAX_STOP_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `workspace_halt`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HaltParams {
    /// Workspace name.
    pub name: String,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `workspace_delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteParams {
    /// Workspace name.
    pub name: String,
    /// Halt it first if it is running (else a running workspace is refused
    /// with CONFLICT).
    #[serde(default)]
    pub force: bool,
    /// Only report what would happen; change nothing.
    #[serde(default)]
    pub preview: bool,
}

/// `workspace_list`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only workspaces in this state.
    pub state: Option<State>,
    /// Only workspaces of this image.
    pub image: Option<String>,
    /// Only workspaces that have all these labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The namespace to list (default: the session's, `default` unless
    /// `serve mcp --namespace` says); `*` lists every namespace.
    pub namespace: Option<String>,
    /// Other agents' workspaces too (read-only to this session: using them
    /// is FORBIDDEN unless shared); default false.
    #[serde(default)]
    pub all_agents: bool,
    /// Only the workspaces this agent owns (devbox's owner filter); another
    /// agent's are listed as `all_agents` lists them.
    pub user: Option<String>,
}

/// `workspace_logs`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogsParams {
    /// Workspace name.
    pub name: String,
    /// The last this many console lines, 1 to 5000; default 100.
    #[schemars(range(min = 1, max = MAX_LOG_LINES))]
    pub lines: Option<usize>,
    /// One of its services (`workspace_create`'s `services`): the last
    /// lines of that service's command's output (stdout, then stderr)
    /// instead of the console.
    pub service: Option<String>,
}

/// `workspace_events`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventsParams {
    /// Workspace name.
    pub name: String,
    /// Only events after this sequence number (the `next_after` of the
    /// previous call); default 0, all events.
    #[serde(default)]
    pub after: u64,
    /// When there is no such event yet, wait up to this many seconds for
    /// one, 0 to 600; default 0.
    #[serde(default)]
    #[schemars(range(min = 0, max = workspace::guest::MAX_EVENT_WAIT.as_secs()))]
    pub wait_secs: u64,
}

/// A change to a workspace (stop, halt), done or previewed.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ChangeResult {
    /// True when nothing was changed: `action` says what would happen.
    pub preview: bool,
    /// What was (or would be) done.
    pub action: String,
    /// The workspace afterwards (before, for a preview).
    pub workspace: Meta,
}

impl Render for ChangeResult {
    fn render(&self) -> String {
        let tag = if self.preview { "preview: " } else { "" };
        format!("{tag}{}\n{}", self.action, self.workspace.render())
    }
}

/// `workspace_delete`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct DeleteResult {
    /// True when nothing was changed: `action` says what would happen.
    pub preview: bool,
    /// What was (or would be) done.
    pub action: String,
    /// The workspace as it was before the delete.
    pub workspace: Meta,
    /// Host disk bytes its files used (freed by the delete).
    pub disk_used_bytes: u64,
}

impl Render for DeleteResult {
    fn render(&self) -> String {
        let tag = if self.preview { "preview: " } else { "" };
        format!(
            "{tag}{} ({} of host disk)",
            self.action,
            human_bytes(self.disk_used_bytes)
        )
    }
}

/// `workspace_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    /// How many matched.
    pub count: usize,
    /// The matching workspaces, by name.
    pub workspaces: Vec<Meta>,
}

impl Render for ListResult {
    fn render(&self) -> String {
        if self.workspaces.is_empty() {
            return "no workspaces".into();
        }
        self.workspaces
            .iter()
            .map(Render::render)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

// `workspace_inspect`'s result.
impl Render for WorkspaceInfo {
    fn render(&self) -> String {
        let mut text = self.meta.render();
        text.push_str(&format!(
            "\nage {} s, disk uses {}",
            self.age_ms / 1000,
            human_bytes(self.disk_used_bytes)
        ));
        if let Some(up) = self.uptime_ms {
            text.push_str(&format!(", up {} s", up / 1000));
        }
        text
    }
}

/// `workspace_logs`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct LogsResult {
    /// The workspace.
    pub name: String,
    /// Serial console lines, oldest first.
    pub lines: Vec<String>,
}

impl Render for LogsResult {
    fn render(&self) -> String {
        if self.lines.is_empty() {
            format!("{}: the console log is empty", self.name)
        } else {
            self.lines.join("\n")
        }
    }
}

/// `workspace_events`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct EventsResult {
    /// The events after `after`, oldest first (empty when the wait ran out).
    pub events: Vec<Event>,
    /// Pass this as `after` next time to get only newer events.
    pub next_after: u64,
}

impl Render for EventsResult {
    fn render(&self) -> String {
        if self.events.is_empty() {
            return format!("no new events (next_after {})", self.next_after);
        }
        self.events
            .iter()
            .map(|e| format!("#{} {}", e.seq, describe(&e.kind)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// An event in a few words: `exec_started `uname -a``, `exec_finished exit 0`.
fn describe(kind: &EventKind) -> String {
    match kind {
        EventKind::Created => "created".into(),
        EventKind::Started { start, ready_ms } => {
            let mut text = "started".to_owned();
            if let Some(kind) = start {
                text.push_str(&format!(" ({})", kind.name()));
            }
            if let Some(ms) = ready_ms {
                text.push_str(&format!(" in {ms} ms"));
            }
            text
        }
        EventKind::ExecStarted { command, .. } => format!("exec_started `{command}`"),
        EventKind::ProcessStarted { id, command } => format!("process_started {id} `{command}`"),
        EventKind::ExecFinished { code, signal, .. } => {
            let mut text = "exec_finished".to_owned();
            if let Some(c) = code {
                text.push_str(&format!(" exit {c}"));
            }
            if let Some(s) = signal {
                text.push_str(&format!(" signal {s}"));
            }
            text
        }
        EventKind::Stopped => "stopped".into(),
        EventKind::Crashed { reason } => format!("crashed: {reason}"),
        EventKind::TtlExpired => "ttl_expired".into(),
        EventKind::SnapshotTaken { snapshot, .. } => format!("snapshot_taken `{snapshot}`"),
        EventKind::SnapshotDeleted { snapshot } => format!("snapshot_deleted `{snapshot}`"),
        EventKind::Forked { from, .. } => format!("forked from `{from}`"),
        EventKind::Paused { cause } => format!("paused ({})", cause.name()),
        EventKind::Resumed { by, paused_ms } => {
            format!("resumed by {by} after {paused_ms} ms paused")
        }
        EventKind::Hibernated {
            by,
            memory_bytes,
            took_ms,
        } => format!(
            "hibernated ({by}): {} MiB of memory written in {took_ms} ms",
            memory_bytes >> 20
        ),
        EventKind::EgressRefused { refusal } => format!("egress_refused {refusal}"),
        EventKind::Restored { snapshot } => format!("restored `{snapshot}`"),
        EventKind::WarmSnapshotDiscarded { reason } => {
            format!("warm snapshot discarded: {reason}")
        }
        EventKind::PoolDrained {
            image,
            members,
            reason,
        } => format!("pool of `{image}`: {members} drained: {reason}"),
    }
}
