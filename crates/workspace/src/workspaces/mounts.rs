//! The volume mounts of workspaces as the collection applies them: a
//! create names its spec's volumes in its namespace, checked as the
//! caller's; a start or a restore takes its volumes only as the rule of
//! `base::volumes` allows (read-write to one running workspace, read-only
//! to any number). The service `ws.volumes()` is the `volumes` folder's.

use super::manager::{ListFilter, Workspaces};
use crate::error::{Error, Result};
use base::store::name::full_name;
use base::store::spec::WorkspaceSpec;
use base::store::volume_mounts::VolumeMount;
use base::volumes::{first_clash, MountedVolume, VolumeStore};

impl Workspaces {
    /// `spec` with its volumes named in `workspace`'s namespace, each one
    /// that exists checked as the caller's to use.
    pub(crate) fn volumes_named_in(
        &self,
        workspace: &str,
        spec: WorkspaceSpec,
    ) -> Result<WorkspaceSpec> {
        let namespace = base::store::name::namespace_of(workspace);
        let store = VolumeStore::new(&self.state);
        let mut spec = spec;
        for m in &mut spec.volumes {
            m.name = full_name(namespace, &m.name)
                .map_err(|e| Error::InvalidInput(format!("volume `{}`: {e}", m.name)))?;
            if let Ok(info) = store.get(&m.name) {
                self.check_owner("volume", &m.name, info.agent.as_deref(), &[])?;
            }
        }
        Ok(spec)
    }

    /// Every shared volume mount of every workspace, here and in every
    /// namespace, with whether its VMM runs.
    pub(crate) fn mounted_volumes(&self) -> Result<Vec<MountedVolume>> {
        let mut out = Vec::new();
        for meta in self.list_everywhere(&ListFilter::default())? {
            out.extend(MountedVolume::of(
                &meta.name,
                meta.state.has_machine(),
                &meta.spec.volumes,
            ));
        }
        Ok(out)
    }

    /// Checks that `mounts` exist and that workspace `name` may take them
    /// now (see [`first_clash`]).
    pub(crate) fn check_mountable(&self, name: &str, mounts: &[VolumeMount]) -> Result<()> {
        let store = VolumeStore::new(&self.state);
        let wanted: Vec<&VolumeMount> = mounts.iter().filter(|m| !m.own_copy).collect();
        if wanted.is_empty() {
            return Ok(());
        }
        for m in &wanted {
            store.get(&m.name)?;
        }
        let mounted = self.mounted_volumes()?;
        match first_clash(name, mounts, &mounted) {
            None => Ok(()),
            Some(held) => Err(Error::VolumeHeld {
                volume: held.volume.clone(),
                holder: held.holder.workspace.clone(),
                mode: if held.holder.read_only {
                    "read-only"
                } else {
                    "read-write"
                },
            }),
        }
    }
}
