//! Inputs and outputs of the host tools: the host changes (preview, then
//! confirm: kernel_install, image_build) and the servers (server_list,
//! server_status).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::host::plan::Preview;
use workspace::images::build::ImageBuild;
use workspace::kernels::KernelInstall;
use workspace::servers::{Availability, ServerReport, ServerStatus};

use crate::output::Render;

/// A kernel variant.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VariantParam {
    /// For hosts whose KVM runs guest kernel mode natively.
    Standard,
    /// With our patches for hosts that emulate guest kernel mode.
    Compat,
}

impl VariantParam {
    /// The library's variant.
    pub fn variant(self) -> workspace::KernelVariant {
        match self {
            Self::Standard => workspace::KernelVariant::Standard,
            Self::Compat => workspace::KernelVariant::Compat,
        }
    }
}

/// `kernel_install`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelInstallParams {
    /// Install this kernel file (ELF vmlinux or bzImage; host path,
    /// relative to the server's working directory) after checking that it
    /// boots the `minimal` image. Without it, the kernel is built from
    /// Debian's linux-source-6.1 with our config and patches.
    #[serde(default)]
    pub file: Option<String>,
    /// Variant to install (default: the one this host needs).
    #[serde(default)]
    pub variant: Option<VariantParam>,
    /// The token a preview returned: applies exactly that plan (refused
    /// when wrong, older than 5 minutes, or the plan changed). Without it
    /// nothing changes and the plan comes back with a token.
    #[serde(default)]
    pub confirm: Option<String>,
}

/// A host file copied into an image build.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CopyParam {
    /// Host path (a file or directory), relative to the server's working
    /// directory and under its roots.
    pub from: String,
    /// Absolute path in the guest.
    pub to: String,
}

/// `image_build`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageBuildParams {
    /// The new image's name.
    pub name: String,
    /// What to build from: `debian:SUITE` (Debian packages by mmdebstrap;
    /// needs a root server) or an image name (booted in a throwaway
    /// workspace).
    pub from: String,
    /// Debian packages to install.
    #[serde(default)]
    pub packages: Vec<String>,
    /// Commands to run in the guest, in order, as root.
    #[serde(default)]
    pub run: Vec<String>,
    /// Host files to copy in before the commands.
    #[serde(default)]
    pub copy: Vec<CopyParam>,
    /// What the image is (one line), for `image_search`.
    #[serde(default)]
    pub description: Option<String>,
    /// vCPUs a workspace of it gets when its create names none (1-8).
    #[serde(default)]
    #[schemars(range(min = 1, max = workspace::LIMITS.max_vcpus))]
    pub vcpus: Option<u8>,
    /// Guest memory a workspace of it gets when its create names none: MiB
    /// (64-16384) or with a unit (`"2g"`).
    #[serde(default, deserialize_with = "workspace::sizes::optional_mib")]
    #[schemars(schema_with = "workspace::sizes::mem_schema")]
    pub mem_mib: Option<u64>,
    /// The token a preview returned: applies exactly that plan. Without it
    /// nothing changes and the plan comes back with a token.
    #[serde(default)]
    pub confirm: Option<String>,
}

impl Render for ImageBuild {
    fn render(&self) -> String {
        match &self.image {
            Some(image) if self.applied => format!(
                "built {} ({} bytes root filesystem)",
                image.name, image.rootfs_bytes
            ),
            _ => describe_plan(&self.preview, "image_build"),
        }
    }
}

impl Render for KernelInstall {
    fn render(&self) -> String {
        if self.applied {
            return format!(
                "installed {} ({})",
                self.kernel
                    .as_ref()
                    .map_or_else(String::new, |k| k.display().to_string()),
                self.version.as_deref().unwrap_or("no version banner")
            );
        }
        describe_plan(&self.preview, "kernel_install")
    }
}

/// A preview in words, with how `tool` applies it.
fn describe_plan(preview: &Preview, tool: &str) -> String {
    let plan = &preview.plan;
    {
        if plan.is_empty() {
            return format!("{}: nothing to do. {}", plan.action, plan.notes.join("; "));
        }
        let mut out = format!("{} would:", plan.action);
        for step in &plan.steps {
            out.push_str(&format!("\n- run `{}`", step.command_line()));
        }
        for note in &plan.notes {
            out.push_str(&format!("\n- {note}"));
        }
        for path in &plan.writes {
            out.push_str(&format!("\n- write {path}"));
        }
        if let Some(token) = &preview.token {
            out.push_str(&format!(
                "\nNothing was changed. Call {tool} again with confirm: \"{token}\" within 5 minutes to apply it."
            ));
        }
        out
    }
}

/// `server_list` takes nothing.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerListParams {}

/// `server_status`: one server.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerStatusParams {
    /// The server (`local`: this host).
    pub name: String,
}

/// `server_list`'s answer.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ServerList {
    /// Every server, `local` first.
    pub servers: Vec<ServerStatus>,
}

fn one_line(s: &ServerStatus) -> String {
    let status = match s.status {
        Availability::Online => "online",
        Availability::Degraded => "degraded",
        Availability::Offline => "offline",
    };
    match (&s.resources, &s.reason) {
        (Some(r), reason) => format!(
            "{}{}: {status}, {} CPUs ({:.0}% used), {} workspaces running, score {}{}",
            s.name,
            s.host
                .as_deref()
                .map_or_else(String::new, |h| format!(" ({h})")),
            r.total_cpus,
            r.cpu_used_percent,
            r.running_workspaces,
            r.available_score,
            reason
                .as_ref()
                .map_or_else(String::new, |r| format!(" ({r})"))
        ),
        (None, reason) => format!("{}: {status} ({})", s.name, reason.as_deref().unwrap_or("")),
    }
}

impl Render for ServerList {
    fn render(&self) -> String {
        self.servers
            .iter()
            .map(one_line)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Render for ServerReport {
    fn render(&self) -> String {
        let mut lines = vec![one_line(&self.server)];
        lines.extend(self.workspaces.iter().map(|w| {
            let used = w
                .usage
                .as_ref()
                .map(|u| {
                    let cpu = u.cpu_percent.map_or("-".into(), |c| format!("{c:.0}%"));
                    let mem = u
                        .memory_used_bytes
                        .map_or("-".into(), |b| format!("{} MiB", b >> 20));
                    format!(", using {cpu} CPU and {mem}")
                })
                .unwrap_or_default();
            format!(
                "  {} ({}, {}, {} vCPU, {} MiB{used})",
                w.name, w.state, w.image, w.vcpus, w.mem_mib
            )
        }));
        lines.join("\n")
    }
}
