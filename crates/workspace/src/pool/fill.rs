//! Filling a pool (what the detached `serve fill-pool IMAGE` runs): each
//! member a fresh workspace warm-started, its first command paid, then
//! paused and marked ready.

use std::time::Duration;

use super::host::PoolHost;
use super::Pools;
use super::{member_spec, PoolError, POOL_NAMESPACE};
use crate::error::{Error, Result};
use base::host::settings::unique_id;
use base::store::file_lock::FileLock;
use base::store::spec::PoolMember;
use base::vmm::control::ControlRequest;

/// How long a new member runs before it is paused: a restored guest
/// finishes work of its own for seconds after its first command, which a
/// pause would leave to the claimed workspace's first command (measured
/// here: 1.5 s for that command unsettled, 1.1 s after 6 s, 0.8 s later).
const SETTLE_BEFORE_PAUSE: Duration = Duration::from_secs(5);

impl<H: PoolHost> Pools<'_, H> {
    /// After `after`, brings `image`'s pool to its size, one member at a
    /// time, until it is there (or past it: the extra members go). Returns at once when
    /// another filler of the image is at work. What the detached filler
    /// (`serve fill-pool IMAGE`) runs.
    pub async fn fill(&self, image: &str, after: Duration) -> Result<usize> {
        tokio::time::sleep(after).await;
        let dir = self.root();
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
                    let _ = self.all.force_delete(&m.name);
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
        let spec = member_spec(image, &self.all.defaults_of(image));
        let net = base::network::NetworkStore::new(self.all.pool_state()).get(&spec.network)?;
        if net.backend != Some(base::network::Backend::User) {
            return Err(PoolError::Network {
                network: spec.network,
            }
            .into());
        }
        let (_, fingerprint) = self.all.warm_key(&spec)?;
        let view = self.view();
        let name = format!("pool-{}.{POOL_NAMESPACE}", unique_id());
        view.create_member(&name, spec)?;
        let made = async {
            Pools::new(&view).mark_member(&name, |m| {
                m.pool = Some(PoolMember::filling(image, fingerprint))
            })?;
            let with_hello = view.start_member(&name).await?;
            tokio::time::sleep(SETTLE_BEFORE_PAUSE).await;
            view.control(&name, ControlRequest::Pause)?;
            Pools::new(&view).mark_member(&name, |m| {
                if let Some(p) = m.pool.as_mut() {
                    p.ready = true;
                    p.identity_with_hello = with_hello;
                }
            })
        }
        .await;
        if made.is_err() {
            let _ = view.force_delete(&name);
        }
        made
    }
}
