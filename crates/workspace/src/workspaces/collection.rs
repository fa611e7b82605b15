//! Creating and listing workspaces, and the images they use: what spans
//! the concerns (names and owners, volumes, networks, repositories, the
//! host budget, pools), so it sits above each of them.

use crate::error::{Error, Result};
use crate::workspaces::manager::{make_disk, ListFilter, Workspaces};
use base::images::registry::ImageInfo;
use base::store::events::EventKind;
use base::store::spec::{Meta, WorkspaceSpec};

impl Workspaces {
    /// Creates a stopped workspace with its writable disk.
    /// `name` is in this view's namespace (or a full name in its own); an
    /// agent's session owns what it creates.
    pub fn create(&self, name: &str, spec: WorkspaceSpec) -> Result<Meta> {
        let meta = self.create_alone(name, spec)?;
        // Each companion is a create of its own, which takes the locks this
        // one held (the network store's among them). On a failure the
        // workspace's delete removes the companions made.
        if let Err(e) = crate::services::create_all(self, &meta.name, &meta.spec) {
            let _ = self
                .at(&meta.name)
                .delete(base::store::spec::DeleteOptions::default().force(true));
            return Err(e);
        }
        Ok(meta)
    }

    /// [`Workspaces::create`] without its services' companions.
    fn create_alone(&self, name: &str, spec: WorkspaceSpec) -> Result<Meta> {
        let full = self.full_name(name)?;
        let name = full.as_str();
        let spec = self.volumes_named_in(name, self.owned_by_caller(spec))?;
        let ws = self.dir(name)?;
        spec.validate_within(&self.limits)?;
        self.check_budget_disk()?;
        ws.check_socket_paths()?;
        if !spec.services.is_empty() {
            ws.check_service_socket_paths()?;
        }
        // What a companion serves is the services' own to set: a spec
        // that names it elsewhere would take another workspace's relays.
        let companion_here = self.namespace == base::store::spec::services::SERVICE_NAMESPACE;
        if (spec.serving.is_some() || !spec.service_ports.is_empty()) && !companion_here {
            return Err(Error::InvalidInput(
                "`serving` and `service_ports` are set by a workspace's services only".into(),
            ));
        }
        base::store::ports::check_free(&spec.ports)?;
        // Held or not, they must exist; who runs with them is the start's
        // concern.
        for m in spec.volumes.iter().filter(|m| !m.own_copy) {
            base::volumes::VolumeStore::new(&self.state).get(&m.name)?;
        }
        let image: ImageInfo = self.images.get(&spec.image)?;
        let (_network, mut spec) = self.networks().place(spec)?;
        if let Some(asked) = &spec.repo {
            let (_, checkout) = crate::repos::checkout::resolve(&self.repos(), asked, &image)?;
            spec.repo = Some(checkout);
        }
        let lock = self.lock(name)?;
        // Taken here, or by a workspace placed on a server from here.
        self.check_name_free(name)?;
        // A directory without metadata is a create that died half-way.
        let _ = std::fs::remove_dir_all(ws.path());
        let made = (|| {
            base::store::make_private_dir(ws.path())?;
            make_disk(&ws.disk(), spec.disk_mib)?;
            if spec.repo.is_some() {
                std::fs::write(ws.repo_pending(), b"")
                    .map_err(Error::host_io("marking the clone to make"))?;
            }
            base::pause_point::pause_point("create:disk");
            let meta = Meta::created(name, spec.with_image(image), true);
            ws.write_meta(&meta)?;
            ws.events().append(EventKind::Created)?;
            Ok(meta)
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir_all(ws.path());
            let _ = self.state.remove_lock(name, lock);
        }
        made
    }
}

impl Workspaces {
    /// Every workspace that matches `filter`, by name.
    pub fn list(&self, filter: &ListFilter) -> Result<Vec<Meta>> {
        self.state.sweep_abandoned();
        let mut out = Vec::new();
        for name in self.state.list_workspaces()? {
            let meta = match self.at(&name).get() {
                Ok(m) => m,
                // Deleted while listing.
                Err(Error::WorkspaceNotFound(_)) => continue,
                // One damaged record does not hide the others; `inspect`
                // names the damage.
                Err(Error::Store(e @ base::store::StoreError::Parse { .. })) => {
                    tracing::warn!("skipping workspace `{name}`: {e}");
                    continue;
                }
                Err(e) => return Err(e),
            };
            if meta.pool.is_some() || self.at(&name).delete_if_orphaned(&meta) {
                continue;
            }
            // The library's own makers of code kernels are no agent's.
            let namespace = base::store::name::namespace_of(&name);
            if self.caller().is_some() && namespace == super::tenancy::READY_NAMESPACE {
                continue;
            }
            let spec = &meta.spec;
            let keep = self.lists(
                base::store::name::namespace_of(&name),
                spec.agent.as_deref(),
                &spec.shared_with,
                filter.all_agents || filter.agent.is_some(),
            ) && filter.state.is_none_or(|s| s == meta.state)
                && filter
                    .agent
                    .as_ref()
                    .is_none_or(|a| spec.agent.as_ref() == Some(a))
                && filter.image.as_ref().is_none_or(|i| *i == meta.spec.image)
                && filter
                    .labels
                    .iter()
                    .all(|(k, v)| meta.spec.labels.get(k) == Some(v));
            if keep {
                out.push(meta);
            }
        }
        Ok(out)
    }
}
