//! A start that claims a pool member instead of launching a VMM.
//!
//! Under both locks, the member's directory replaces the fresh
//! workspace's (which holds nothing but its record, an empty disk and its
//! events), and the member's lock file takes the workspace's name. The
//! member's VMM sees neither rename: its private root holds its directory
//! and lock file bind-mounted by their old paths, the same inodes. Then the
//! machine resumes and the guest takes the workspace's name, fresh
//! randomness and the clock, before the start returns, as a warm start's
//! guest does.

use std::io::Read;
use std::time::{Duration, Instant};

use guest_agent::protocol::NewIdentity;

use super::claimable;
use super::host::PoolHost;
use super::Pools;
use crate::error::{Error, Result};
use base::host::settings::now_ms;
use base::store::events::{EventKind, EVENTS_FILE};
use base::store::spec::{Meta, StartKind};
use base::store::state::State;
use base::vmm::control::ControlRequest;

/// How long a refill waits after a claim: a member's start takes both
/// CPUs of a small host for seconds, which the claimed workspace's first
/// commands would otherwise share.
const REFILL_AFTER_CLAIM: Duration = Duration::from_secs(3);

/// How long the guest may take to answer the identity request.
const IDENTITY_TIMEOUT: Duration = Duration::from_secs(10);

impl<H: PoolHost> Pools<'_, H> {
    /// Starts fresh workspace `name` from its image's pool when it has a
    /// ready member that fits; `None`: it has none (the caller launches a
    /// VMM). A claim tops the pool up in the background.
    pub(crate) async fn claim(&self, name: &str) -> Result<Option<Meta>> {
        let meta = self.all.record_here(name)?;
        if !meta.pristine || meta.pool.is_some() || self.size(&meta.spec.image)? == 0 {
            return Ok(None);
        }
        let image = meta.spec.image.clone();
        let name = name.to_owned();
        let all = self.all.clone();
        let claimed = tokio::task::spawn_blocking(move || {
            let pools = Pools::new(&all);
            for member in pools.members(&meta.spec.image)? {
                if member.ready && claimable(&meta.spec, &member.spec) {
                    if let Some(meta) = pools.take_member(&name, &member.name)? {
                        return Ok(Some(meta));
                    }
                }
            }
            Ok(None)
        })
        .await
        .map_err(|e| Error::BlockingStep(e.to_string()))
        .and_then(|r| r);
        // Refilled whether or not this start found a member, once the
        // claimed workspace's first command has had the CPUs to itself.
        if let Err(e) = self.spawn_filler(&image, REFILL_AFTER_CLAIM) {
            tracing::warn!("the pool of {image} cannot be refilled: {e}");
        }
        // A claim that failed left the fresh workspace as it was: it
        // starts as if there were no pool.
        Ok(claimed.unwrap_or_else(|e| {
            tracing::warn!("no pool member of {image} could be claimed: {e}");
            None
        }))
    }

    /// Moves ready member `member` into fresh workspace `name` and runs
    /// it as `name`; `None` when either changed meanwhile.
    fn take_member(&self, name: &str, member: &str) -> Result<Option<Meta>> {
        let began = Instant::now();
        let pool = self.view();
        let Some(member_lock) = self.all.pool_state().try_lock_workspace(member)? else {
            return Ok(None);
        };
        let Ok(held) = pool.workspace_dir(member)?.read_meta() else {
            return Ok(None);
        };
        let (name_lock, fresh) = self.all.lock_record(name)?;
        let ready = held.pool.as_ref().is_some_and(|p| p.ready) && held.state == State::Running;
        if !ready || !fresh.pristine || fresh.state != State::Stopped {
            return Ok(None);
        }
        let Some(rt) = held.runtime.clone() else {
            return Ok(None);
        };
        let (ws, from) = (self.all.workspace_dir(name)?, pool.workspace_dir(member)?);
        let parked = ws.path().with_file_name(format!(
            "{}{name}-{}",
            base::store::DELETING_PREFIX,
            std::process::id()
        ));
        let io = |what: &str| Error::host_io(format!("{what} for the claim of a pool member"));
        std::fs::rename(ws.path(), &parked).map_err(io("setting the fresh workspace aside"))?;
        if let Err(e) = std::fs::rename(from.path(), ws.path()) {
            let _ = std::fs::rename(&parked, ws.path());
            return Err(io("moving the member in")(e));
        }
        // The workspace keeps its own events and a clone still to make.
        for file in [EVENTS_FILE, base::store::workspace_dir::REPO_PENDING] {
            let _ = std::fs::rename(parked.join(file), ws.path().join(file));
        }
        let _ = std::fs::remove_dir_all(&parked);
        // Whoever waits on the old lock file finds it replaced and takes
        // this one, which the member's lock still holds.
        if let Err(e) = std::fs::rename(
            self.all.pool_state().lock_path(member),
            self.all.pool_state().lock_path(name),
        ) {
            self.put_back_fresh(name, &fresh)?;
            return Err(io("renaming the member's lock")(e));
        }
        drop(name_lock);
        let now = now_ms();
        let mut runtime = rt;
        runtime.started_at_ms = now;
        runtime.ready_at_ms = Some(now);
        runtime.ttl_deadline_ms = None;
        runtime.start_kind = Some(StartKind::Pooled);
        runtime.launched_mono_ns = None;
        runtime.vcpu_running_us = None;
        runtime.ready_us = None;
        runtime.paused = None;
        runtime.paused_at_ms = None;
        let mut meta = fresh.clone();
        meta.state = State::Running;
        meta.runtime = Some(runtime);
        meta.pool = None;
        meta.pristine = false;
        let with_hello = held.pool.as_ref().is_some_and(|p| p.identity_with_hello);
        let resumed = self.resume_as(name, with_hello).and_then(|()| {
            if let Some(rt) = meta.runtime.as_mut() {
                rt.ready_us = Some(began.elapsed().as_micros() as u64);
            }
            Ok(ws.write_meta(&meta)?)
        });
        if let Err(e) = resumed {
            tracing::warn!("a pool member could not become {name}: {e}");
            self.put_back_fresh(name, &fresh)?;
            return Ok(None);
        }
        // The VMM records the deadline itself, under the lock held here.
        drop(member_lock);
        if let Some(ttl) = meta.spec.ttl_secs {
            self.all.give_ttl(name, ttl)?;
            meta = ws.read_meta()?;
        }
        ws.events().append(EventKind::Started {
            start: Some(StartKind::Pooled),
            ready_ms: Some(began.elapsed().as_millis() as u64),
        })?;
        Ok(Some(meta))
    }

    /// Resumes the claimed machine; its guest takes the workspace's name,
    /// fresh randomness and the clock with the first request when its agent
    /// can (`with_hello`), else now, on a connection of its own. Either
    /// way before any command runs.
    fn resume_as(&self, name: &str, with_hello: bool) -> Result<()> {
        let ws = self.all.workspace_dir(name)?;
        let began = Instant::now();
        let mut entropy = [0u8; 64];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut entropy))
            .map_err(Error::host_io("reading host randomness"))?;
        let identity = NewIdentity {
            hostname: name.to_owned(),
            entropy: entropy.iter().map(|b| format!("{b:02x}")).collect(),
            unix_time_ns: 0,
        };
        if with_hello {
            ws.set_pending_identity(&identity)?;
        }
        self.all.control(name, ControlRequest::Resume)?;
        let resumed = began.elapsed();
        if !with_hello {
            ws.agent_blocking(IDENTITY_TIMEOUT)
                .and_then(|agent| agent.restored(name, &entropy, None))
                .map(drop)
                .map_err(|source| Error::Agent {
                    op: "identity",
                    source,
                })?;
        }
        tracing::debug!(
            resumed_us = resumed.as_micros() as u64,
            identity_us = began.elapsed().as_micros() as u64,
            with_hello,
            "claimed a pool member for {name}"
        );
        Ok(())
    }

    /// Undoes a claim that failed after the move (the caller holds the
    /// lock): the member's VMM goes, and `name` is as `create` made it,
    /// for a start of its own.
    fn put_back_fresh(&self, name: &str, fresh: &Meta) -> Result<()> {
        let ws = self.all.workspace_dir(name)?;
        let now = ws.read_meta()?;
        ws.clear_pending_identity();
        if let Some(rt) = &now.runtime {
            base::store::process::kill(rt.pid, rt.pid_start);
            base::store::process::wait_gone(rt.pid, rt.pid_start, Duration::from_secs(10));
        }
        base::host::cgroup::remove_recorded(ws.path());
        self.all.fresh_disk(&ws.disk(), fresh.spec.disk_mib)?;
        ws.write_meta(fresh)?;
        Ok(())
    }
}
