//! Task caches: a task mounts the cache volume of its agent, its
//! repository and its slot (`tasks::slots::cache_volume`), owned by that
//! agent (a task the host started: nobody's), so another agent's session
//! can neither mount, export nor delete it, nor plant what the next task's
//! `~/.cache` runs. `task slots` lists them.

use crate::agents::access::may_use;
use crate::error::{Error, Result};
use crate::tasks::slots::{self, TaskCache};
use crate::workspaces::services::Tasks;
use base::volumes::{VolumeError, VolumeSource};

impl Tasks<'_> {
    /// The task cache volumes this view may use, with whose they are and
    /// the repository their key names (found among the allowlisted ones).
    pub(crate) fn caches(&self) -> Result<Vec<TaskCache>> {
        let aliases: Vec<String> = self
            .all
            .repos()
            .list()?
            .into_iter()
            .map(|r| r.alias)
            .collect();
        let mut out = Vec::new();
        for info in self.all.volumes().store().list()? {
            let short = info.name.split('.').next().unwrap_or_default();
            let Some((key, slot)) = slots::parse_cache_volume(short) else {
                continue;
            };
            if !may_use(self.all.caller(), info.agent.as_deref(), &[]) {
                continue;
            }
            let agent = info.agent.as_deref();
            let repo = key.and_then(|key| {
                aliases
                    .iter()
                    .find(|alias| slots::cache_key(agent, alias) == key)
                    .cloned()
            });
            out.push(TaskCache {
                volume: info.name.clone(),
                slot,
                agent: info.agent.clone(),
                repo,
                size_mib: info.size_mib,
                used_bytes: info.used_bytes,
                legacy: key.is_none(),
            });
        }
        Ok(out)
    }

    /// The cache volume of `agent`'s tasks (none: the host's) on `repo` in
    /// `slot`, made when missing, owned by `agent`. FORBIDDEN when a volume
    /// of its name belongs to anyone else: what the task's `~/.cache` runs
    /// comes from its own agent's earlier tasks only.
    pub(crate) fn cache(&self, agent: Option<&str>, repo: &str, slot: u32) -> Result<String> {
        let name = self
            .all
            .full_name(&slots::cache_volume(agent, repo, slot))?;
        match self.all.volumes().store().get(&name) {
            Ok(info) if info.agent.as_deref() == agent => Ok(name),
            Ok(info) => Err(Error::OwnedByAnotherAgent {
                kind: "task cache volume",
                name,
                owner: info.agent.unwrap_or_else(|| "no agent".into()),
            }),
            Err(VolumeError::NotFound(_)) => {
                self.all.check_budget_disk()?;
                self.all.volumes().store().create(
                    &name,
                    Some(slots::CACHE_SIZE_MIB),
                    &VolumeSource::Empty,
                    agent.map(str::to_owned),
                )?;
                Ok(name)
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {

    use crate::tasks::slots::cache_volume;
    use crate::workspaces::manager::tests::{fixture, have_mkfs, session, spec};
    use crate::workspaces::manager::Workspaces;
    use base::code::ErrorCode;
    use base::store::spec::WorkspaceSpec;
    use base::store::volume_mounts::VolumeMount;
    use base::volumes::VolumeSource;
    use base::volumes::CACHE_MOUNT;

    fn mounting(cache: &str) -> WorkspaceSpec {
        WorkspaceSpec {
            volumes: vec![VolumeMount {
                name: cache.into(),
                path: CACHE_MOUNT.into(),
                read_only: false,
                own_copy: false,
            }],
            ..spec()
        }
    }

    #[test]
    fn a_second_agent_mounting_a_task_cache_is_forbidden() {
        if !have_mkfs("a_second_agent_mounting_a_task_cache_is_forbidden") {
            return;
        }
        let f = fixture("task-caches", "/nonexistent");
        let root = f.ws.state.root().to_path_buf();
        let repo = root.join("proj");
        std::fs::create_dir_all(&repo).unwrap();
        let init = std::process::Command::new("git")
            .args(["init", "-q"])
            .arg(&repo)
            .status()
            .unwrap();
        assert!(init.success());
        f.ws.repos().allow(&repo, Some("proj"), None).unwrap();
        let (a, b, anonymous) = (
            session(&f.ws, Some("a")),
            session(&f.ws, Some("b")),
            session(&f.ws, None),
        );

        // What agent a's task's supervisor (the host's view) does.
        let cache = f.ws.tasks().cache(Some("a"), "proj", 2).unwrap();
        assert_eq!(cache, cache_volume(Some("a"), "proj", 2));
        let info = f.ws.volumes().store().get(&cache).unwrap();
        assert_eq!(info.agent.as_deref(), Some("a"));
        assert_eq!(f.ws.tasks().cache(Some("a"), "proj", 2).unwrap(), cache);
        let host_cache = f.ws.tasks().cache(None, "proj", 2).unwrap();
        assert_ne!(host_cache, cache, "the host's tasks have their own");
        assert_eq!(f.ws.volumes().store().get(&host_cache).unwrap().agent, None);

        // Another agent, or a session without one: no mount, export,
        // inspection or delete.
        for other in [&b, &anonymous] {
            let refused = other.create("borrower", mounting(&cache)).unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
            let readonly = WorkspaceSpec {
                volumes: vec![VolumeMount {
                    read_only: true,
                    own_copy: true,
                    ..mounting(&cache).volumes[0].clone()
                }],
                ..spec()
            };
            let refused = other.create("reader", readonly).unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
            let refused = other.volumes().delete(&cache, false).unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
            let out = root.join("stolen.tar");
            let refused = other.volumes().export(&cache, &out).unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
            assert!(!out.exists());
            let refused = other.volumes().inspect(&cache).unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
        }
        assert!(f.ws.volumes().store().get(&cache).is_ok(), "still there");

        // No session makes a volume of a cache's name (to plant in it).
        let planted = b.volumes().create(
            &cache_volume(Some("a"), "proj", 3),
            Some(16),
            &VolumeSource::Empty,
        );
        assert_eq!(planted.unwrap_err().code(), ErrorCode::InvalidInput);
        // One made behind the sessions' back is refused to a's task.
        let squatted = cache_volume(Some("a"), "proj", 4);
        f.ws.volumes()
            .store()
            .create(&squatted, Some(16), &VolumeSource::Empty, Some("b".into()))
            .unwrap();
        let refused = f.ws.tasks().cache(Some("a"), "proj", 4).unwrap_err();
        assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");

        // `task slots` shows each cache with its agent and repository: a
        // session sees its own and nobody's, the host all.
        let shown = |ws: &Workspaces| {
            let mut caches: Vec<(String, Option<String>, Option<String>, u32)> = ws
                .tasks()
                .slots()
                .unwrap()
                .caches
                .into_iter()
                .map(|c| (c.volume, c.agent, c.repo, c.slot))
                .collect();
            caches.sort();
            caches
        };
        let of_a = (cache.clone(), Some("a".into()), Some("proj".into()), 2);
        let of_host = (host_cache.clone(), None, Some("proj".into()), 2);
        assert!(shown(&a).contains(&of_a) && shown(&a).contains(&of_host));
        assert!(!shown(&b).iter().any(|c| c.0 == cache));
        assert!(shown(&b).contains(&of_host));
        assert_eq!(shown(&f.ws).len(), 3, "{:?}", shown(&f.ws));
        // An older version's cache is listed as such, and left alone.
        f.ws.volumes()
            .store()
            .create("task-cache-1", Some(16), &VolumeSource::Empty, None)
            .unwrap();
        let legacy = f.ws.tasks().slots().unwrap().caches;
        let legacy = legacy.iter().find(|c| c.volume == "task-cache-1").unwrap();
        assert!(legacy.legacy && legacy.repo.is_none() && legacy.slot == 1);

        // Its owner mounts it, and removes it.
        a.create("mine", mounting(&cache)).unwrap();
        a.workspace("mine")
            .unwrap()
            .delete(base::store::spec::DeleteOptions::default().force(true))
            .unwrap();
        a.volumes().delete(&cache, false).unwrap();
        assert!(f.ws.volumes().store().get(&cache).is_err());
    }
}
