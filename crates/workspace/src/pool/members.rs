//! A pool's members: which are alive and current (the rest are deleted,
//! each drain in the pool's event log), and the filler that brings a pool
//! to its size.

use super::host::PoolHost;
use super::Pools;
use std::path::PathBuf;

use super::{member_spec, POOL_DIR, POOL_NAMESPACE};
use crate::error::Result;
use base::store::events::{EventKind, EventLog};
use base::store::name::namespace_of;
use base::store::spec::{Meta, WorkspaceSpec};
use base::store::state::State;

/// A live member of a pool.
#[derive(Clone, Debug)]
pub(crate) struct Member {
    /// Its full name.
    pub name: String,
    /// Paused and claimable.
    pub ready: bool,
    /// What it runs.
    pub spec: WorkspaceSpec,
}

impl<H: PoolHost> Pools<'_, H> {
    /// The pools' directory in the state directory.
    pub(super) fn root(&self) -> PathBuf {
        self.all.pool_state().root().join(POOL_DIR)
    }

    /// The pool's own event log (drains).
    pub fn events(&self) -> EventLog {
        EventLog::new(&self.root())
    }

    /// Records that `members` of `image`'s pool went, and why.
    pub(crate) fn record_drain(&self, image: &str, members: usize, reason: &str) {
        if members == 0 {
            return;
        }
        tracing::info!("pool of {image}: {members} member(s) drained: {reason}");
        let _ = std::fs::create_dir_all(self.root());
        let _ = self.events().append(EventKind::PoolDrained {
            image: image.to_owned(),
            members,
            reason: reason.to_owned(),
        });
    }

    /// This collection seen from the pool's namespace, acting for no one.
    pub(crate) fn view(&self) -> H {
        self.all.pool_view()
    }

    /// The records of every pool member, of every image.
    fn member_records(&self) -> Result<Vec<(String, Meta)>> {
        Ok(self
            .all
            .pool_state()
            .list_workspaces()?
            .into_iter()
            .filter(|n| namespace_of(n) == POOL_NAMESPACE)
            .filter_map(|n| self.all.record(&n).ok().map(|m| (n, m)))
            .collect())
    }

    /// The images that have members.
    pub(super) fn member_images(&self) -> Result<Vec<String>> {
        let mut images: Vec<String> = self
            .member_records()?
            .into_iter()
            .filter_map(|(_, m)| m.pool.map(|p| p.image))
            .collect();
        images.sort();
        images.dedup();
        Ok(images)
    }

    /// The warm fingerprint a member of `image` must have to be claimed.
    fn fingerprint(&self, image: &str) -> Option<String> {
        let defaults = self.all.defaults_of(image);
        self.all
            .warm_key(&member_spec(image, &defaults))
            .ok()
            .map(|(_, fingerprint)| fingerprint)
    }

    /// `image`'s live, current members. A member whose VMM died is
    /// deleted; one of another image or kernel build is drained.
    pub(crate) fn members(&self, image: &str) -> Result<Vec<Member>> {
        let current = self.fingerprint(image);
        let (mut live, mut stale) = (Vec::new(), 0);
        for (name, meta) in self.member_records()? {
            let Some(member) = meta.pool.clone().filter(|p| p.image == image) else {
                continue;
            };
            // A member being made is stopped and pristine until its start.
            let dead =
                meta.state == State::Crashed || (meta.state == State::Stopped && !meta.pristine);
            let outdated = current.as_deref() != Some(member.fingerprint.as_str());
            if dead || outdated {
                if self.all.force_delete(&name).is_ok() && outdated && !dead {
                    stale += 1;
                }
                continue;
            }
            live.push(Member {
                name,
                ready: member.ready,
                spec: meta.spec,
            });
        }
        self.record_drain(
            image,
            stale,
            "its image, its kernel or the snapshot format changed",
        );
        Ok(live)
    }

    /// Deletes every member of `image`'s pool (the image is going).
    pub(crate) fn drain(&self, image: &str, reason: &str) -> Result<()> {
        let mut gone = 0;
        for (name, meta) in self.member_records()? {
            if meta.pool.is_some_and(|p| p.image == image) && self.all.force_delete(&name).is_ok() {
                gone += 1;
            }
        }
        self.record_drain(image, gone, reason);
        Ok(())
    }

    /// Gives back one ready member (the oldest), of any image, for a start
    /// the host budget refused; false when there was none.
    pub(crate) fn give_back_a_member(&self) -> bool {
        let Ok(records) = self.member_records() else {
            return false;
        };
        let oldest = records
            .into_iter()
            .filter(|(_, m)| m.pool.as_ref().is_some_and(|p| p.ready))
            .min_by_key(|(_, m)| m.created_at_ms);
        let Some((name, meta)) = oldest else {
            return false;
        };
        let image = meta.pool.map(|p| p.image).unwrap_or_default();
        let gone = self.all.force_delete(&name).is_ok();
        self.record_drain(
            &image,
            usize::from(gone),
            "a start needed its memory (host budget)",
        );
        gone
    }

    /// Changes a member's record under its lock.
    pub(crate) fn mark_member(&self, name: &str, change: impl FnOnce(&mut Meta)) -> Result<()> {
        let (_lock, mut meta) = self.all.lock_record(name)?;
        change(&mut meta);
        Ok(self.all.workspace_dir(name)?.write_meta(&meta)?)
    }
}
