//! Inputs and outputs of the tools that run commands: `workspace_exec` and
//! `run_code`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::guest::code::Language;

use crate::output::Render;
use workspace::guest::copy::human_bytes;

/// Default bytes of each output stream returned.
pub const DEFAULT_OUTPUT_CAP: u64 = 64 << 10;
/// Most bytes of each output stream one call returns.
pub const MAX_OUTPUT_CAP: u64 = 4 << 20;
/// Longest command timeout.
pub const MAX_EXEC_TIMEOUT_SECS: u64 = 24 * 3600;

/// A command as models send it: an argv array, or one command line (run
/// through /bin/sh -c, as `shell` is).
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum CommandArg {
    /// Program and arguments.
    Argv(Vec<String>),
    /// A command line.
    Line(String),
}

/// `workspace_exec`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecParams {
    /// Workspace name (running).
    pub name: String,
    /// Program and arguments, run directly (the program is looked up in
    /// PATH), e.g. ["uname", "-a"]; a single string is run as `shell` is.
    /// Give this or `shell`.
    pub command: Option<CommandArg>,
    /// Arguments after `command` when it is one string naming the
    /// program (`command: "ls", args: ["-l", "/"]`, as microsandbox's
    /// `sandbox_run_command` takes them): run directly, without a shell.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// A command line run with /bin/sh -c (pipes, redirections, globs),
    /// e.g. "ls -l /etc | head". Give this or `command`.
    pub shell: Option<String>,
    /// Extra environment variables (over the workspace's own).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of secrets given to the command as environment variables of
    /// the same name (set on the host with `microagent secret set NAME`;
    /// each must be allowed with `serve mcp --allow-secret NAME`, else
    /// FORBIDDEN). Their values are never returned: output shows `***`.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Working directory in the guest (absolute); default: the image's,
    /// else /.
    pub cwd: Option<String>,
    /// Run as this user: a name the guest's /etc/passwd lists (`root`,
    /// `node`), a uid, or `user:group`; default: the image's user, else
    /// root.
    #[serde(default)]
    pub user: Option<String>,
    /// Text given to the command's stdin (then end of file); default: none
    /// (/dev/null).
    pub stdin: Option<String>,
    /// Kill the command and its process group after this many seconds, 1
    /// to 86400; default: no limit (cancel the call to kill it).
    #[schemars(range(min = 1, max = MAX_EXEC_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// Bytes of each of stdout and stderr returned, 0 to 4194304; default
    /// 65536. The rest is counted (stdout_dropped, stderr_dropped), not
    /// returned.
    #[schemars(range(min = 0, max = MAX_OUTPUT_CAP))]
    pub output_cap: Option<u64>,
    /// Files to bring back after the command: absolute guest paths or
    /// globs (`/out/report.txt`, `/out/*.png`, `/out/**/*.csv`; at most
    /// 16 patterns, 32 files). Each comes back as content beside the text:
    /// PNG, JPEG, GIF, WebP and SVG as image content, other files as
    /// embedded resources (text inline, the rest base64), up to 1 MiB each
    /// and 8 MiB in all; a larger file is copied to the host and linked.
    #[serde(default)]
    pub outputs: Vec<String>,
}

/// `run_code`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeParams {
    /// Source code, run as a script file by the language's interpreter.
    pub code: String,
    /// python (default; python3), javascript (node) or bash.
    #[serde(default)]
    pub language: Language,
    /// A running workspace to run it in (its image must have the
    /// interpreter, as `debian` has all three). Default: a one-shot
    /// workspace of the `debian` image, created, started and deleted around
    /// the run.
    pub workspace: Option<String>,
    /// Text given to the program's stdin (then end of file).
    pub stdin: Option<String>,
    /// Kill the program after this many seconds, 1 to 86400; default: no
    /// limit.
    #[schemars(range(min = 1, max = MAX_EXEC_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// Bytes of each of stdout and stderr returned, 0 to 4194304; default
    /// 65536.
    #[schemars(range(min = 0, max = MAX_OUTPUT_CAP))]
    pub output_cap: Option<u64>,
    /// One-shot only: seconds to wait for the workspace to boot, 1 to 3600;
    /// default 300.
    #[schemars(range(min = 1, max = crate::schema::lifecycle::MAX_START_TIMEOUT_SECS))]
    pub start_timeout_secs: Option<u64>,
    /// One-shot only: vCPUs, 1 to 8; default 1.
    #[schemars(range(min = 1, max = workspace::LIMITS.max_vcpus))]
    pub vcpus: Option<u32>,
    /// One-shot only: guest memory in MiB, 64 to 16384, or with a unit
    /// (`"1g"`); default 512.
    #[serde(default, deserialize_with = "workspace::sizes::optional_mib")]
    #[schemars(schema_with = "workspace::sizes::mem_schema")]
    pub mem_mib: Option<u64>,
    /// One-shot only: what the code may reach, "all" (default: all but the
    /// host's loopback, link-local and private addresses), "none" or
    /// "allowlist".
    pub egress: Option<workspace::network::Egress>,
    /// One-shot only: rules opening more: "pypi.org", "*.pythonhosted.org",
    /// an address or CIDR with or without ":PORT", or "host:PORT".
    #[serde(default)]
    pub allow: Vec<workspace::network::AllowEntry>,
    /// One-shot only: named volumes to mount, each {name, path[, read_only]}.
    #[serde(default)]
    pub volumes: Vec<crate::schema::volumes::VolumeParam>,
    /// Files to bring back after the command: absolute guest paths or
    /// globs (`/out/report.txt`, `/out/*.png`, `/out/**/*.csv`; at most
    /// 16 patterns, 32 files). Each comes back as content beside the text:
    /// PNG, JPEG, GIF, WebP and SVG as image content, other files as
    /// embedded resources (text inline, the rest base64), up to 1 MiB each
    /// and 8 MiB in all; a larger file is copied to the host and linked.
    #[serde(default)]
    pub outputs: Vec<String>,
}

/// How a command ended and what it printed.
#[derive(Clone, Debug, Serialize, JsonSchema)]
// The schema keeps the name clients have always seen.
#[schemars(rename = "ExecResult")]
pub struct ExecReply {
    /// The library's result.
    #[serde(flatten)]
    pub ran: workspace::ExecResult,
    /// When output was dropped: how to get all of it.
    pub truncated_hint: Option<String>,
    /// The files `outputs` matched after the command: each also comes back
    /// as content beside the text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<crate::schema::outputs::OutputSummary>,
    /// `outputs` patterns that matched no file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmatched_outputs: Vec<String>,
    /// The content blocks of `outputs`.
    #[serde(skip)]
    #[schemars(skip)]
    pub output_blocks: Vec<rmcp::model::ContentBlock>,
}

impl ExecReply {
    /// This reply with the files `outputs` from `workspace` brought back.
    pub fn with_outputs(mut self, workspace: &str, outputs: &workspace::guest::Outputs) -> Self {
        let (summaries, blocks) = crate::schema::outputs::content(workspace, outputs);
        self.outputs = summaries;
        self.output_blocks = blocks;
        self.unmatched_outputs.clone_from(&outputs.unmatched);
        self
    }

    /// The library's result, with a hint when output past `cap` was dropped.
    pub fn new(ran: workspace::ExecResult, cap: u64) -> Self {
        let truncated_hint = ran.output_dropped().then(|| {
            format!(
                "output past {} per stream was dropped ({} of stdout, {} of stderr): rerun with a larger output_cap (at most {}), or redirect the output to a file (`cmd > /tmp/out.txt 2>&1`) and read it with file_read using offset and length",
                human_bytes(cap),
                human_bytes(ran.stdout_dropped),
                human_bytes(ran.stderr_dropped),
                human_bytes(MAX_OUTPUT_CAP)
            )
        });
        Self {
            ran,
            truncated_hint,
            outputs: Vec::new(),
            unmatched_outputs: Vec::new(),
            output_blocks: Vec::new(),
        }
    }

    /// "exit 0", "killed by signal 9", "timed out".
    pub fn status(&self) -> String {
        let ran = &self.ran;
        if ran.timed_out {
            "timed out and was killed".into()
        } else if let Some(code) = ran.exit_code {
            format!("exit {code}")
        } else if let Some(sig) = ran.signal {
            format!("killed by signal {sig}")
        } else {
            "ended without a status".into()
        }
    }
}

impl Render for ExecReply {
    fn render(&self) -> String {
        let mut text = format!("{} after {} ms", self.status(), self.ran.wall_ms);
        for (what, out) in [("stdout", &self.ran.stdout), ("stderr", &self.ran.stderr)] {
            if !out.is_empty() {
                text.push_str(&format!("\n--- {what} ---\n{out}"));
                if !out.ends_with('\n') {
                    text.push('\n');
                }
            }
        }
        if let Some(hint) = &self.truncated_hint {
            text.push_str(&format!("\n{hint}"));
        }
        for o in &self.outputs {
            text.push_str(&format!(
                "\noutput {} ({} bytes, {}){}",
                o.path,
                o.size,
                o.mime_type,
                o.host_path
                    .as_ref()
                    .map(|p| format!(": past the inline cap, copied to {p}"))
                    .unwrap_or_default()
            ));
        }
        for p in &self.unmatched_outputs {
            text.push_str(&format!("\noutput pattern {p} matched no file"));
        }
        text
    }

    fn blocks(&self) -> Vec<rmcp::model::ContentBlock> {
        self.output_blocks.clone()
    }
}

/// `run_code`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RunCodeResult {
    /// The workspace it ran in.
    pub workspace: String,
    /// True when the workspace was created for this run and is now deleted.
    pub one_shot: bool,
    /// The language it ran as.
    pub language: Language,
    /// How the program ended and what it printed.
    #[serde(flatten)]
    pub result: ExecReply,
}

impl Render for RunCodeResult {
    fn render(&self) -> String {
        let place = if self.one_shot {
            format!("one-shot workspace {} (deleted)", self.workspace)
        } else {
            format!("workspace {}", self.workspace)
        };
        let interpreter = self.language.interpreter();
        format!("{interpreter} in {place}: {}", self.result.render())
    }

    fn blocks(&self) -> Vec<rmcp::model::ContentBlock> {
        self.result.blocks()
    }
}

/// A file `run` writes into its workspace before the command.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunFile {
    /// Absolute guest path (parent directories must exist; /tmp and /root
    /// do).
    pub path: String,
    /// UTF-8 text.
    pub content: String,
}

/// `run`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    /// Program and arguments (an array), or one command line (a string,
    /// run with /bin/sh -c). Give this or `shell`.
    pub command: Option<CommandArg>,
    /// A command line run with /bin/sh -c. Give this or `command`.
    pub shell: Option<String>,
    /// Image of the one-shot workspace; default `minimal` (busybox);
    /// `debian` has Python and apt. An OCI reference
    /// (`python:3.12-alpine`) is pulled first as `pull` says.
    pub image: Option<String>,
    /// When an `image` reference is pulled: `never`, `missing` (default),
    /// `always`.
    pub pull: Option<workspace::images::pull::PullPolicy>,
    /// Environment variables for the command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of secrets given to the command as environment variables of
    /// the same name (set on the host with `microagent secret set NAME`;
    /// each must be allowed with `serve mcp --allow-secret NAME`, else
    /// FORBIDDEN). Their values are never returned: output shows `***`.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Files written first (at most 16, 1 MiB in all).
    #[serde(default)]
    pub files: Vec<RunFile>,
    /// Text given to the command's stdin (then end of file).
    pub stdin: Option<String>,
    /// Kill the command after this many seconds, 1 to 86400; default: no
    /// limit (the workspace's TTL of 1 h still applies).
    #[schemars(range(min = 1, max = MAX_EXEC_TIMEOUT_SECS))]
    pub timeout_secs: Option<u64>,
    /// Bytes of each of stdout and stderr returned, 0 to 4194304; default
    /// 65536.
    #[schemars(range(min = 0, max = MAX_OUTPUT_CAP))]
    pub output_cap: Option<u64>,
    /// Seconds to wait for the workspace to boot, 1 to 3600; default 300.
    #[schemars(range(min = 1, max = crate::schema::lifecycle::MAX_START_TIMEOUT_SECS))]
    pub start_timeout_secs: Option<u64>,
    /// Network: "user" (default), "none" or one from network_create.
    pub network: Option<String>,
    /// What the guest may reach: "all", "none" or "allowlist"; default:
    /// the network's (on "user": all but the host and private addresses).
    pub egress: Option<workspace::network::Egress>,
    /// Rules opening more than the mode (at most 256): a domain
    /// ("pypi.org": it and the names under it; "*.pythonhosted.org": only
    /// the names under it), an IPv4 address or CIDR with or without
    /// ":PORT", or "host:PORT" (a port on the host's loopback, reached in
    /// the guest as host.microagent.internal:PORT).
    #[serde(default)]
    pub allow: Vec<workspace::network::AllowEntry>,
    /// Named volumes to mount, each {name, path[, read_only]}: the one-shot
    /// workspace is deleted, what it wrote to a read-write volume stays.
    #[serde(default)]
    pub volumes: Vec<crate::schema::volumes::VolumeParam>,
    /// Files to bring back after the command: absolute guest paths or
    /// globs (`/out/report.txt`, `/out/*.png`, `/out/**/*.csv`; at most
    /// 16 patterns, 32 files). Each comes back as content beside the text:
    /// PNG, JPEG, GIF, WebP and SVG as image content, other files as
    /// embedded resources (text inline, the rest base64), up to 1 MiB each
    /// and 8 MiB in all; a larger file is copied to the host and linked.
    #[serde(default)]
    pub outputs: Vec<String>,
}

/// `run`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RunResult {
    /// The one-shot workspace it ran in (now deleted).
    pub workspace: String,
    /// How the command ended and what it printed.
    #[serde(flatten)]
    pub result: ExecReply,
}

impl Render for RunResult {
    fn render(&self) -> String {
        format!(
            "one-shot workspace {} (deleted): {}",
            self.workspace,
            self.result.render()
        )
    }

    fn blocks(&self) -> Vec<rmcp::model::ContentBlock> {
        self.result.blocks()
    }
}
