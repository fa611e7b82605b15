//! Volumes as workspaces use them, the service `ws.volumes()`: who mounts
//! each, the rule a start checks (read-write to one running workspace,
//! read-only to any number), and the operations front ends call, which add
//! the holders to what the volume store knows.

use std::path::Path;

use super::manager::{ListFilter, Workspaces};
use crate::error::{Error, Result};
use base::store::name::full_name;
use base::store::spec::{Meta, WorkspaceSpec};
use base::store::volume_mounts::VolumeMount;
use base::volumes::{VolumeExport, VolumeHolder, VolumeInfo, VolumeSource, VolumeStore};

/// The named volumes of a collection, as its view (an agent's session or
/// the host's) sees them: `ws.volumes()`.
#[derive(Clone, Copy, Debug)]
pub struct Volumes<'a> {
    all: &'a Workspaces,
}

impl Workspaces {
    /// The volumes of this state directory, as this view sees them.
    pub fn volumes(&self) -> Volumes<'_> {
        Volumes { all: self }
    }

    /// The servers this state directory knows, and where its remote
    /// workspaces live (docs/servers.md).
    pub fn servers(&self) -> crate::servers::ServerRegistry {
        crate::servers::ServerRegistry::new(&self.state)
    }

    /// `spec` with its volumes named in `workspace`'s namespace, each one
    /// that exists checked as the caller's to use.
    pub(crate) fn volumes_named_in(
        &self,
        workspace: &str,
        spec: WorkspaceSpec,
    ) -> Result<WorkspaceSpec> {
        let namespace = base::store::name::namespace_of(workspace);
        let mut spec = spec;
        for m in &mut spec.volumes {
            m.name = full_name(namespace, &m.name)
                .map_err(|e| Error::InvalidInput(format!("volume `{}`: {e}", m.name)))?;
            if let Ok(info) = self.volumes().store().get(&m.name) {
                self.check_owner("volume", &m.name, info.agent.as_deref(), &[])?;
            }
        }
        Ok(spec)
    }
}

impl Volumes<'_> {
    /// The volume records of the state directory, unchecked for the view.
    pub(crate) fn store(&self) -> VolumeStore {
        VolumeStore::new(&self.all.state)
    }

    /// Every workspace's volume mounts, with whether its VMM runs.
    fn mounts(&self) -> Result<Vec<(Meta, VolumeMount)>> {
        Ok(self
            .all
            .list_everywhere(&ListFilter::default())?
            .into_iter()
            .flat_map(|meta| {
                let mounts = meta.spec.volumes.clone();
                mounts.into_iter().map(move |m| (meta.clone(), m))
            })
            .filter(|(_, m)| !m.own_copy)
            .collect())
    }

    /// The workspaces that mount volume `name`.
    pub fn holders(&self, name: &str) -> Result<Vec<VolumeHolder>> {
        Ok(holders_of(&self.mounts()?, name))
    }

    /// Volume `name` (in this view's namespace, or a full name) with its
    /// holders; FORBIDDEN when another agent owns it.
    pub fn inspect(&self, name: &str) -> Result<VolumeInfo> {
        let name = self.all.full_name(name)?;
        let mut info = self.store().get(&name)?;
        self.all
            .check_owner("volume", &name, info.agent.as_deref(), &[])?;
        info.holders = self.holders(&name)?;
        Ok(info)
    }

    /// Every volume in this view's namespace with its holders, by name: an
    /// agent's view lists its own and nobody's, or with `all_agents` every
    /// agent's (the others' stay FORBIDDEN to use).
    pub fn list(&self, all_agents: bool) -> Result<Vec<VolumeInfo>> {
        let mounts = self.mounts()?;
        let mut out = self.store().list()?;
        out.retain(|info| {
            let namespace = base::store::name::namespace_of(&info.name);
            self.all
                .lists(namespace, info.agent.as_deref(), &[], all_agents)
        });
        for info in &mut out {
            info.holders = holders_of(&mounts, &info.name);
        }
        Ok(out)
    }

    /// Makes volume `name` (see [`VolumeStore::create`]) in this view's
    /// namespace, its agent's when an agent's session makes it, when the
    /// host budget leaves room. A session may not take a task cache's name
    /// (INVALID_INPUT): tasks make their caches themselves, so no agent
    /// makes one that another agent's task would then mount.
    pub fn create(
        &self,
        name: &str,
        size_mib: Option<u64>,
        source: &VolumeSource,
    ) -> Result<VolumeInfo> {
        let name = self.all.full_name(name)?;
        if self.all.caller().is_some() && name.starts_with(base::volumes::CACHE_PREFIX) {
            return Err(Error::InvalidInput(format!(
                "volume names starting with `{}` are kept for task caches; choose another name",
                base::volumes::CACHE_PREFIX
            )));
        }
        self.all.check_budget_disk()?;
        Ok(self
            .store()
            .create(&name, size_mib, source, self.all.creating_agent())?)
    }

    /// Removes volume `name` unless a workspace mounts it (CONFLICT naming
    /// them); with `preview` it only checks. Returns what goes.
    pub fn delete(&self, name: &str, preview: bool) -> Result<VolumeInfo> {
        let info = self.inspect(name)?;
        let name = info.name.as_str();
        let holders: Vec<String> = info.holders.iter().map(|h| h.workspace.clone()).collect();
        if preview && holders.is_empty() {
            return Ok(info);
        }
        self.store().remove(name, holders)?;
        Ok(info)
    }

    /// Writes volume `name`'s files to the new tar file `to`, unless a
    /// running workspace may be writing it.
    pub fn export(&self, name: &str, to: &Path) -> Result<VolumeExport> {
        let info = self.inspect(name)?;
        let name = info.name.as_str();
        if let Some(h) = self
            .holders(name)?
            .into_iter()
            .find(|h| h.active && !h.read_only)
        {
            return Err(Error::VolumeHeld {
                volume: name.to_owned(),
                holder: h.workspace,
                mode: "read-write",
            });
        }
        Ok(self.store().export(name, to)?)
    }

    /// Checks that `mounts` exist and that workspace `name` may take them
    /// now: a read-write volume no other running workspace mounts, a
    /// read-only one no other running workspace mounts read-write.
    pub(crate) fn check_mountable(&self, name: &str, mounts: &[VolumeMount]) -> Result<()> {
        let volumes = self.store();
        let wanted: Vec<&VolumeMount> = mounts.iter().filter(|m| !m.own_copy).collect();
        if wanted.is_empty() {
            return Ok(());
        }
        for m in &wanted {
            volumes.get(&m.name)?;
        }
        for (meta, held) in self.mounts()? {
            if meta.name == name || !meta.state.has_vmm() {
                continue;
            }
            let clash = wanted
                .iter()
                .any(|m| m.name == held.name && !(m.read_only && held.read_only));
            if clash {
                return Err(Error::VolumeHeld {
                    volume: held.name,
                    holder: meta.name,
                    mode: if held.read_only {
                        "read-only"
                    } else {
                        "read-write"
                    },
                });
            }
        }
        Ok(())
    }
}

/// The holders of volume `name` among `mounts`.
fn holders_of(mounts: &[(Meta, VolumeMount)], name: &str) -> Vec<VolumeHolder> {
    mounts
        .iter()
        .filter(|(_, m)| m.name == name)
        .map(|(meta, m)| VolumeHolder {
            workspace: meta.name.clone(),
            path: m.path.clone(),
            read_only: m.read_only,
            active: meta.state.has_vmm(),
        })
        .collect()
}
