//! The service `ws.volumes()`: the named volumes of a collection as its
//! view sees them, each with the workspaces that mount it, and the
//! operations front ends call, which add the holders to what the volume
//! store knows. A start's and a restore's check of the mounts is the
//! collection's (`Workspaces::check_mountable`), on the same rule.

use std::path::Path;

use crate::error::{Error, Result};
use crate::workspaces::services::Volumes;
use base::volumes::{
    holders_of, VolumeExport, VolumeHolder, VolumeInfo, VolumeSource, VolumeStore,
};

impl Volumes<'_> {
    /// The volume records of the state directory, unchecked for the view.
    pub(crate) fn store(&self) -> VolumeStore {
        VolumeStore::new(&self.all.state)
    }

    /// The workspaces that mount volume `name`.
    pub fn holders(&self, name: &str) -> Result<Vec<VolumeHolder>> {
        Ok(holders_of(&self.all.mounted_volumes()?, name))
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
        let mounted = self.all.mounted_volumes()?;
        let mut out = self.store().list()?;
        out.retain(|info| {
            let namespace = base::store::name::namespace_of(&info.name);
            self.all
                .lists(namespace, info.agent.as_deref(), &[], all_agents)
        });
        for info in &mut out {
            info.holders = holders_of(&mounted, &info.name);
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
        // Its holders as `inspect` just listed them.
        let info = self.inspect(name)?;
        let name = info.name.as_str();
        if let Some(h) = info.holders.iter().find(|h| h.active && !h.read_only) {
            return Err(Error::VolumeHeld {
                volume: name.to_owned(),
                holder: h.workspace.clone(),
                mode: "read-write",
            });
        }
        Ok(self.store().export(name, to)?)
    }
}
