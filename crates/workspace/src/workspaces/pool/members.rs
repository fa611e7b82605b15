//! A pool's members: which are alive and current (the rest are deleted),
//! and the filler that brings a pool to its size.

use std::time::Duration;

use super::Pools;
use crate::error::Error;
use crate::error::Result;
use crate::host::settings::unique_id;
use crate::pool::{member_spec, PoolError, POOL_DIR, POOL_NAMESPACE};
use crate::store::file_lock::FileLock;
use crate::store::name::namespace_of;
use crate::store::spec::{DeleteOptions, Meta, PoolMember, WorkspaceSpec};
use crate::store::state::State;
use crate::vmm::control::ControlRequest;
use crate::workspaces::lifecycle::DEFAULT_START_TIMEOUT;
use crate::workspaces::manager::Workspaces;

/// How long a new member runs before it is paused: a restored guest
/// finishes work of its own for seconds after its first command, which a
/// pause would leave to the claimed workspace's first command (measured
/// here: 1.5 s for that command unsettled, 1.1 s after 6 s, 0.8 s later).
const SETTLE_BEFORE_PAUSE: Duration = Duration::from_secs(5);

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

impl Pools<'_> {
    /// This collection seen from the pool's namespace, acting for no one.
    pub(crate) fn view(&self) -> Workspaces {
        let mut view = self.all.clone();
        view.namespace = POOL_NAMESPACE.to_owned();
        view.caller = None;
        view
    }

    /// The records of every pool member, of every image.
    fn member_records(&self) -> Result<Vec<(String, Meta)>> {
        Ok(self
            .all
            .state
            .list_workspaces()?
            .into_iter()
            .filter(|n| namespace_of(n) == POOL_NAMESPACE)
            .filter_map(|n| self.all.at(&n).get().ok().map(|m| (n, m)))
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
        self.all
            .warm_identity(&member_spec(image))
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
                let force = DeleteOptions::default().force(true);
                if self.all.at(&name).delete(force).is_ok() && outdated && !dead {
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
            if meta.pool.is_some_and(|p| p.image == image)
                && self
                    .all
                    .at(&name)
                    .delete(DeleteOptions::default().force(true))
                    .is_ok()
            {
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
        let gone = self
            .all
            .at(&name)
            .delete(DeleteOptions::default().force(true))
            .is_ok();
        self.record_drain(
            &image,
            usize::from(gone),
            "a start needed its memory (host budget)",
        );
        gone
    }

    /// After `after`, brings `image`'s pool to its size, one member at a
    /// time, until it is there (or past it: the extra members go). Returns at once when
    /// another filler of the image is at work. What the detached filler
    /// (`serve fill-pool IMAGE`) runs.
    pub async fn fill(&self, image: &str, after: Duration) -> Result<usize> {
        tokio::time::sleep(after).await;
        let dir = self.all.state.root().join(POOL_DIR);
        std::fs::create_dir_all(&dir).map_err(Error::host_io("creating the pool directory"))?;
        let lock_path = dir.join(format!("{image}.fill.lock"));
        let Some(_filling) = FileLock::try_exclusive(&lock_path)
            .map_err(Error::host_io(format!("locking {}", lock_path.display())))?
        else {
            return Ok(0);
        };
        let mut added = 0;
        loop {
            let size = self.size(image)?;
            let members = self.members(image)?;
            if members.len() > size {
                let extra = members.len() - size;
                for m in members.iter().rev().take(extra) {
                    let _ = self
                        .all
                        .at(&m.name)
                        .delete(DeleteOptions::default().force(true));
                }
                self.record_drain(image, extra, "the pool was made smaller");
                return Ok(added);
            }
            if members.len() == size {
                return Ok(added);
            }
            self.add_member(image).await?;
            added += 1;
        }
    }

    /// Makes one member of `image`'s pool: created, started (warm when it
    /// can), paused, then marked ready. A member that fails is deleted.
    async fn add_member(&self, image: &str) -> Result<()> {
        self.check_poolable()?;
        let spec = member_spec(image);
        let net = crate::network::NetworkStore::new(&self.all.state).get(&spec.network)?;
        if net.backend != Some(crate::network::Backend::User) {
            return Err(PoolError::Network {
                network: spec.network,
            }
            .into());
        }
        let (_, fingerprint) = self.all.warm_identity(&spec)?;
        let view = self.view();
        let name = format!("pool-{}.{POOL_NAMESPACE}", unique_id());
        view.create(&name, spec)?;
        let made = async {
            view.pools().mark_member(&name, |m| {
                m.pool = Some(PoolMember {
                    image: image.to_owned(),
                    fingerprint,
                    ready: false,
                    identity_with_hello: false,
                })
            })?;
            view.start_maybe_warm(&name, DEFAULT_START_TIMEOUT, |_| {}, false)
                .await?;
            let ws = view.dir(&name)?;
            let hello = ws
                .connect_agent()
                .await
                .map_err(Error::agent("connect"))?
                .hello()
                .await
                .map_err(Error::agent("hello"))?;
            let with_hello = hello.capabilities.iter().any(|c| c == "hello_identity");
            // The first command in a restored guest pays for what it loads
            // (the shell, the agent's exec path): paid here, not by the
            // claim's first command.
            view.at(&name).exec_true().await?;
            tokio::time::sleep(SETTLE_BEFORE_PAUSE).await;
            view.pause_or_resume(&name, ControlRequest::Pause)?;
            view.pools().mark_member(&name, |m| {
                if let Some(p) = m.pool.as_mut() {
                    p.ready = true;
                    p.identity_with_hello = with_hello;
                }
            })
        }
        .await;
        if made.is_err() {
            let _ = view.at(&name).delete(DeleteOptions::default().force(true));
        }
        made
    }

    /// Changes a member's record under its lock.
    fn mark_member(&self, name: &str, change: impl FnOnce(&mut Meta)) -> Result<()> {
        let (_lock, mut meta) = self.all.lock_existing(name)?;
        change(&mut meta);
        Ok(self.all.dir(name)?.write_meta(&meta)?)
    }
}
