//! The service `ws.pools()`: sizes in config.json, status, the filler's
//! start and the drain log; members are `members`, a start's claim
//! `claim`, the filling `fill`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::host::PoolHost;
use super::Pools;
use crate::error::{Error, Result};
use crate::pool::{PoolError, PoolStatus, FILL_SUBCOMMAND, MAX_POOL_SIZE, POOL_KEY};
use base::host::settings::config_section;

impl<H: PoolHost> Pools<'_, H> {
    /// The pool sizes config.json sets, by image.
    pub fn sizes(&self) -> Result<BTreeMap<String, usize>> {
        Ok(config_section(self.all.pool_state().root(), POOL_KEY)
            .map_err(PoolError::Config)?
            .map(|(sizes, _)| sizes)
            .unwrap_or_default())
    }

    pub(crate) fn size(&self, image: &str) -> Result<usize> {
        Ok(self.sizes()?.get(image).copied().unwrap_or(0))
    }

    /// Keeps `size` ready workspaces of `image` (0: none), in config.json,
    /// and starts a filler that brings the pool to that size in the
    /// background (or drains what is past it).
    pub fn set_size(&self, image: &str, size: usize) -> Result<PoolStatus> {
        if size > MAX_POOL_SIZE {
            return Err(PoolError::TooLarge { asked: size }.into());
        }
        let image = self.all.registered_image(image)?;
        if size > 0 {
            self.check_poolable()?;
        }
        let mut sizes = self.sizes()?;
        if size == 0 {
            sizes.remove(&image);
        } else {
            sizes.insert(image.clone(), size);
        }
        base::host::settings::set_config_section(self.all.pool_state().root(), POOL_KEY, &sizes)
            .map_err(PoolError::Config)?;
        // A pool now short or past its size gets its filler there.
        self.status_of(&image, size)
    }

    /// Every configured pool (and any image that still has members), with
    /// what is ready. A pool found short gets a filler.
    pub fn status(&self) -> Result<Vec<PoolStatus>> {
        let mut sizes = self.sizes()?;
        for image in self.member_images()? {
            sizes.entry(image).or_insert(0);
        }
        sizes
            .iter()
            .map(|(image, size)| self.status_of(image, *size))
            .collect()
    }

    /// `image`'s pool, whose size is `size`; a filler when it is not.
    fn status_of(&self, image: &str, size: usize) -> Result<PoolStatus> {
        let members = self.members(image)?;
        let ready = members.iter().filter(|m| m.ready).count();
        let starting = members.len() - ready;
        if members.len() != size {
            self.spawn_filler(image, Duration::ZERO)?;
        }
        Ok(PoolStatus {
            image: image.to_owned(),
            size,
            ready,
            starting,
        })
    }

    /// Refuses pools on a host whose VMMs get no private root.
    pub(crate) fn check_poolable(&self) -> Result<()> {
        base::host::jail::availability()
            .map(drop)
            .map_err(|e| PoolError::NoPrivateRoot { why: e.why }.into())
    }

    /// Starts `serve fill-pool IMAGE --after-ms N` detached; it waits
    /// `after`, then exits at once when another filler of the image is at
    /// work.
    pub(crate) fn spawn_filler(&self, image: &str, after: Duration) -> Result<()> {
        std::fs::create_dir_all(self.root())
            .map_err(Error::host_io("creating the pool directory"))?;
        let args: Vec<String> = FILL_SUBCOMMAND
            .iter()
            .map(|a| a.to_string())
            .chain([
                image.to_owned(),
                "--after-ms".to_owned(),
                after.as_millis().to_string(),
            ])
            .collect();
        self.all.detach(&args, &self.root().join("fill.log"))
    }
}
