//! Inputs and outputs of the volume tools (volume_create, volume_list,
//! volume_inspect, volume_delete) and the `volumes` a workspace mounts.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use workspace::store::volume_mounts::VolumeMount;
use workspace::volumes::VolumeInfo;

use crate::output::Render;

/// A named volume a workspace mounts.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeParam {
    /// The volume's name (from `volume_create`).
    pub name: String,
    /// The absolute guest directory it is mounted on (made if missing),
    /// e.g. "/data".
    pub path: String,
    /// Mount read-only: any number of workspaces may; read-write, one
    /// running workspace at a time (CONFLICT otherwise, naming it).
    #[serde(default)]
    pub read_only: bool,
}

/// The library's mounts of `params`.
pub fn mounts(params: &[VolumeParam]) -> Vec<VolumeMount> {
    params
        .iter()
        .map(|p| VolumeMount {
            name: p.name.clone(),
            path: p.path.clone(),
            read_only: p.read_only,
            own_copy: false,
        })
        .collect()
}

/// `volume_create`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeParams {
    /// The new volume's name (lowercase letters, digits, '-').
    pub name: String,
    /// The namespace it goes in (default: the session's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Its size in MiB, or with a unit (`"10g"`); default 1024, or what
    /// the source needs (sparse: it takes the host space its files use).
    #[serde(default, deserialize_with = "workspace::sizes::optional_mib")]
    #[schemars(schema_with = "workspace::sizes::volume_schema")]
    pub size_mib: Option<u64>,
    /// Fill it with a host directory's files (relative to the server's
    /// working directory, beneath one of its host roots); they belong to
    /// the guest's `user`, modes kept.
    #[serde(default)]
    pub from_dir: Option<String>,
    /// Fill it with a tar file's files (plain or gzip; owners kept),
    /// beneath one of the server's host roots.
    #[serde(default)]
    pub from_tar: Option<String>,
}

/// `volume_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeListParams {
    /// The namespace to list (default: the session's); `*` lists every
    /// namespace.
    pub namespace: Option<String>,
    /// Other agents' volumes too (FORBIDDEN to use unless shared);
    /// default false.
    #[serde(default)]
    pub all_agents: bool,
}

/// `volume_inspect`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeNameParams {
    /// Volume name (see `volume_list`).
    pub name: String,
}

/// `volume_delete`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteVolumeParams {
    /// Volume name; refused (CONFLICT) while a workspace mounts it.
    pub name: String,
    /// Only check and report what would be removed.
    #[serde(default)]
    pub preview: bool,
}

/// One volume and who mounts it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeResult {
    /// The volume.
    #[serde(flatten)]
    pub volume: VolumeInfo,
}

/// Every volume.
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeList {
    /// The volumes, by name.
    pub volumes: Vec<VolumeInfo>,
}

/// What `volume_delete` did or would do.
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeDeleteResult {
    /// It was only a preview.
    pub preview: bool,
    /// `would delete` or `did delete`.
    pub action: String,
    /// The volume.
    pub volume: VolumeInfo,
}

fn line(v: &VolumeInfo) -> String {
    let holders: Vec<String> = v
        .holders
        .iter()
        .map(|h| {
            let ro = if h.read_only { " (read-only)" } else { "" };
            format!("{} at {}{ro}", h.workspace, h.path)
        })
        .collect();
    format!(
        "{}: {} MiB, {} MiB used, mounted by {}",
        v.name,
        v.size_mib,
        v.used_bytes >> 20,
        if holders.is_empty() {
            "none".to_owned()
        } else {
            holders.join(", ")
        }
    )
}

impl Render for VolumeResult {
    fn render(&self) -> String {
        line(&self.volume)
    }
}

impl Render for VolumeList {
    fn render(&self) -> String {
        if self.volumes.is_empty() {
            return "no volumes; make one with volume_create".into();
        }
        self.volumes.iter().map(line).collect::<Vec<_>>().join("\n")
    }
}

impl Render for VolumeDeleteResult {
    fn render(&self) -> String {
        format!("{} volume {}", self.action, self.volume.name)
    }
}
