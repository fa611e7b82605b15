//! Where a workspace lives: here, or on a server of the pool. The handle
//! is made here (`Workspaces::workspace`, its access checked), finds out
//! with [`Workspace::remote`], and
//! its calls then go there as `WorkspaceCall`s; the server answers them
//! with `Workspaces::answer_call` (admin/remote_ops.rs), on its own
//! library.

use crate::error::{Error, Result};
use crate::servers::{PlacedWorkspace, RemoteWorkspace, ServerError, LOCAL_SERVER};
use crate::workspaces::handle::Workspace;
use crate::workspaces::manager::{WorkspaceInfo, Workspaces};
use base::host::settings::now_ms;
use base::store::name::FullName;
use base::store::spec::Meta;

impl Workspaces {
    /// The workspace called `name` in this view's namespace (a full name
    /// `name.namespace` in its own), after checking the name rules and,
    /// when it exists and this view is an agent's, that the agent may use
    /// it (FORBIDDEN otherwise).
    ///
    /// ```no_run
    /// # async fn demo() -> workspace::Result<()> {
    /// let all = workspace::Workspaces::from_env()?;
    /// let dev = all.workspace("dev")?;
    /// let out = dev
    ///     .exec_collect(workspace::ExecRequest::argv(["uname", "-a"]), workspace::ExecInput::None)
    ///     .await?;
    /// print!("{}", out.stdout);
    /// # Ok(())
    /// # }
    /// ```
    pub fn workspace(&self, name: &str) -> Result<Workspace<'_>> {
        let full = self.full_name(name)?;
        let name = FullName::new(&full).map_err(base::store::StoreError::Name)?;
        if self.caller.is_some() {
            match self.dir(&name)?.read_meta() {
                Ok(meta) => self.check_access("workspace", &name, &meta.spec)?,
                // Not here: on a server, whose owner was recorded here.
                Err(base::store::workspace_dir::WorkspaceDirError::NotFound(_)) => {
                    self.placement_of(name.as_str())?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Workspace { all: self, name })
    }

    /// Where workspace `name` lives when on a remote server (`None`: not
    /// placed on one from here). FORBIDDEN when its owner (the agent whose
    /// session created it) is not this view's caller and did not share it:
    /// every forwarded operation finds its target through this, before any
    /// ssh runs.
    pub fn placement_of(&self, name: &str) -> Result<Option<PlacedWorkspace>> {
        let Some(placed) = self.servers().placement(name)? else {
            return Ok(None);
        };
        self.check_owner("workspace", name, placed.agent.as_deref(), &[])?;
        Ok(Some(placed))
    }

    /// Checks that this view may forward an operation on workspace `name`
    /// to `server`: FORBIDDEN as [`Self::placement_of`] says; a session
    /// reaches only what was placed on that server from here (its owner is
    /// known only then), else NOT_FOUND. The host reaches any.
    pub(crate) fn check_forward(&self, server: &str, name: &str) -> Result<()> {
        match self.placement_of(name)? {
            Some(placed) if placed.server == server => Ok(()),
            _ if self.caller().is_none() => Ok(()),
            _ => Err(Error::WorkspaceNotFound(name.to_owned())),
        }
    }

    /// CONFLICT when full name `name` is taken, here or by a placement: a
    /// name lives in one place, so a placed workspace never shadows one
    /// here (whose owner would meet the placement's owner, and whose calls
    /// would go to the server) nor the reverse. Checked before any ssh.
    pub(crate) fn check_name_free(&self, name: &str) -> Result<()> {
        let here = self.dir(name)?.meta_path().exists();
        if here || self.servers().placement(name)?.is_some() {
            return Err(Error::WorkspaceExists(name.to_owned()));
        }
        Ok(())
    }
}

impl Workspaces {
    /// Places full name `name` on `server` before the server makes it (a
    /// create's or a fork's call there): under the name's lock it must be
    /// free here and among the placements, and it is placed (its owner the
    /// creating agent) before any ssh, so no create here and no other
    /// placement takes the name while the server makes it. The placement
    /// goes again when the reservation is dropped before
    /// [`PlacementReservation::made`]: a make that failed, was cancelled or
    /// cut short.
    pub fn reserve_placement(&self, server: &str, name: &str) -> Result<PlacementReservation<'_>> {
        let _lock = self.lock(name)?;
        self.check_name_free(name)?;
        let agent = self.creating_agent();
        let record = self.servers().place(name, server, agent.as_deref())?;
        Ok(PlacementReservation {
            all: self,
            record: Some(record),
        })
    }

    /// Makes workspace `name` on `server` with `make`, placed from the
    /// start ([`Self::reserve_placement`]); when `make` fails, is dropped,
    /// or the server answers for another name, the placement goes again.
    pub(crate) async fn make_placed<F>(&self, server: &str, name: &str, make: F) -> Result<Meta>
    where
        F: std::future::Future<Output = Result<Meta>>,
    {
        let reservation = self.reserve_placement(server, name)?;
        let meta = make.await?;
        check_made(server, name, &meta)?;
        reservation.made();
        Ok(meta)
    }

    /// Removes placement `record` if it is still the record of its name
    /// (never one written since, by another create).
    fn release_placement(&self, record: &PlacedWorkspace) -> Result<()> {
        let _lock = self.lock(&record.workspace)?;
        let servers = self.servers();
        if servers.placement(&record.workspace)?.as_ref() == Some(record) {
            servers.unplace(&record.workspace)?;
        }
        Ok(())
    }
}

/// A name placed on a server before the server makes it
/// ([`Workspaces::reserve_placement`]).
#[derive(Debug)]
#[must_use = "dropped, the placement goes again"]
pub struct PlacementReservation<'a> {
    all: &'a Workspaces,
    record: Option<PlacedWorkspace>,
}

impl PlacementReservation<'_> {
    /// The server made the workspace: the placement stays.
    pub fn made(mut self) {
        self.record = None;
    }
}

impl Drop for PlacementReservation<'_> {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            if let Err(e) = self.all.release_placement(&record) {
                tracing::warn!(
                    "the placement of {} made for a create that did not finish stays: {e}",
                    record.workspace
                );
            }
        }
    }
}

/// A server's answer about the workspace `asked` it made (a create's, a
/// fork's), as data: its name must be the one asked for, so what this host
/// then records (a placement, a start) is about the name it checked, never
/// one a server chose.
pub(crate) fn check_made(server: &str, asked: &str, meta: &Meta) -> Result<()> {
    if meta.name != asked {
        return Err(ServerError::Garbled {
            server: server.to_owned(),
            detail: format!(
                "it answered for workspace {:?} when asked to make {asked:?}",
                meta.name
            ),
        }
        .into());
    }
    Ok(())
}

impl Workspace<'_> {
    /// Where this workspace's calls go when it lives on a server of the
    /// pool (`None`: here). FORBIDDEN as [`Workspaces::placement_of`] says.
    pub fn remote(self) -> Result<Option<RemoteWorkspace>> {
        let Some(placed) = self.all.placement_of(self.name())? else {
            return Ok(None);
        };
        if placed.server == LOCAL_SERVER {
            return Ok(None);
        }
        let registry = self.all.servers();
        let server = registry.get(&placed.server)?;
        Ok(Some(RemoteWorkspace::new(registry, server, self.name())))
    }
}

impl Workspace<'_> {
    /// Reads a workspace, first recording a crash if its VMM died.
    pub fn get(self) -> Result<Meta> {
        if let Some(remote) = self.remote()? {
            let info: WorkspaceInfo =
                remote.call_blocking(crate::servers::WorkspaceCall::Inspect {})?;
            return Ok(info.meta);
        }
        self.get_here()
    }
}

impl Workspace<'_> {
    /// The record plus ages, disk use, its network as it is now and,
    /// while it runs on the `user` network, its egress refusals.
    pub fn inspect(self) -> Result<WorkspaceInfo> {
        if let Some(remote) = self.remote()? {
            return Ok(remote.call_blocking(crate::servers::WorkspaceCall::Inspect {})?);
        }
        let (all, name) = (self.all, self.name.as_str());
        let meta = self.get_here()?;
        // A VMM that does not answer leaves the rest to show.
        let refused = match meta.state.has_vmm() {
            true => self.egress().denials().unwrap_or_else(|e| {
                tracing::warn!(workspace = name, "no egress refusals: {e}");
                None
            }),
            false => None,
        };
        let ws = all.dir(name)?;
        let now = now_ms();
        let disk_used_bytes = std::fs::metadata(ws.disk())
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
            .unwrap_or(0);
        Ok(WorkspaceInfo {
            age_ms: now.saturating_sub(meta.created_at_ms),
            uptime_ms: meta
                .runtime
                .as_ref()
                .map(|r| now.saturating_sub(r.started_at_ms)),
            dir: ws.path().to_owned(),
            disk_used_bytes,
            network: all.networks().guest(&meta),
            refused,
            services: crate::services::infos(all, name, &meta.spec),
            meta,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::servers::ServerSpec;
    use crate::workspaces::manager::tests::{fixture, have_mkfs, session, spec};
    use base::code::ErrorCode;
    use base::store::state::State;

    fn code<T: std::fmt::Debug>(r: Result<T>) -> ErrorCode {
        r.unwrap_err().code()
    }

    #[tokio::test]
    async fn a_name_lives_in_one_place_and_no_create_or_fork_takes_anothers() {
        let f = fixture("placement-names", "/nonexistent");
        let (a, b) = (session(&f.ws, Some("a")), session(&f.ws, Some("b")));
        // Nothing listens on port 1: a call that gets past the checks
        // meets the unreachable server (HOST_UNSUPPORTED).
        let servers = f.ws.servers();
        for name in ["box", "box2"] {
            let server = ServerSpec::new(name, "nobody@127.0.0.1:1");
            servers.add(&server).unwrap();
        }
        servers.place("dev", "box", Some("a")).unwrap();
        let placed_dev = || servers.placement("dev").unwrap().unwrap();
        let before = placed_dev();

        // Another agent's create of the same name on another server would
        // have made the placement its own; on the same one, or by the
        // owner or the host, a second spelling of the name: refused
        // before any ssh.
        for (who, server) in [(&b, "box2"), (&b, "box"), (&a, "box2"), (&f.ws, "box")] {
            let made = who
                .server_pool()
                .create_on_server(server, "dev", &spec(), crate::servers::GivenSizes::ALL)
                .await;
            assert_eq!(code(made), ErrorCode::Conflict, "{server}");
        }
        // Nor here: the name is the placed workspace's.
        assert_eq!(code(b.create("dev", spec())), ErrorCode::Conflict);
        assert_eq!(code(f.ws.create("dev", spec())), ErrorCode::Conflict);
        // Names with path tricks or the pool's namespace never reach a server.
        let pool = format!("w.{}", crate::pool::POOL_NAMESPACE);
        for bad in ["../x", "a/b", "", pool.as_str()] {
            let made = b
                .server_pool()
                .create_on_server("box2", bad, &spec(), crate::servers::GivenSizes::ALL)
                .await;
            assert_eq!(code(made), ErrorCode::InvalidInput, "{bad:?}");
        }

        // A fork of a placed workspace: the other agent is refused before
        // any ssh; the owner's names are checked here first.
        let wait = Duration::from_secs(60);
        let forked = |who: &'static str, to: &'static str| {
            let view = if who == "a" { &a } else { &b };
            async move { view.workspace("dev")?.fork(to, None, wait, |_| {}).await }
        };
        assert_eq!(code(forked("b", "mine").await), ErrorCode::Forbidden);
        assert_eq!(code(forked("a", "dev").await), ErrorCode::Conflict);
        assert_eq!(code(forked("a", "../x").await), ErrorCode::InvalidInput);
        let into_pool = a.workspace("dev").unwrap().fork(&pool, None, wait, |_| {});
        assert_eq!(code(into_pool.await), ErrorCode::InvalidInput);
        assert_eq!(code(forked("a", "fresh").await), ErrorCode::HostUnsupported);

        if have_mkfs("a_name_lives_in_one_place_and_no_create_or_fork_takes_anothers") {
            // A workspace here is not shadowed by a placement of its name:
            // not by a create on a server, nor by a fork there.
            f.ws.create("here", spec()).unwrap();
            let made = b
                .server_pool()
                .create_on_server("box2", "here", &spec(), crate::servers::GivenSizes::ALL)
                .await;
            assert_eq!(code(made), ErrorCode::Conflict);
            assert_eq!(code(forked("a", "here").await), ErrorCode::Conflict);
            let here = f.ws.workspace("here").unwrap();
            assert!(here.remote().unwrap().is_none());
            assert_eq!(here.get().unwrap().state, State::Stopped);
        }
        // A create there that fails leaves no placement behind.
        let (pool_a, pool_b, other) = (a.server_pool(), b.server_pool(), spec());
        let made = pool_a
            .create_on_server("box", "other", &other, crate::servers::GivenSizes::ALL)
            .await;
        assert_eq!(code(made), ErrorCode::HostUnsupported);
        // While a server makes a workspace its name is placed already, so
        // no create here or there takes it meanwhile; a failure unplaces it.
        let make = async {
            assert_eq!(servers.placement("held").unwrap().unwrap().server, "box");
            assert_eq!(code(f.ws.create("held", spec())), ErrorCode::Conflict);
            let there = pool_b
                .create_on_server("box2", "held", &other, crate::servers::GivenSizes::ALL)
                .await;
            assert_eq!(code(there), ErrorCode::Conflict);
            Err(Error::InvalidInput("the server refused it".into()))
        };
        let made = a.make_placed("box", "held", make).await;
        assert_eq!(code(made), ErrorCode::InvalidInput);
        assert!(servers.placement("held").unwrap().is_none());
        // A make that is dropped half-way (an MCP cancel, a deadline)
        // leaves no placement either.
        let never = std::future::pending::<Result<Meta>>();
        let cut = tokio::time::timeout(
            Duration::from_millis(50),
            a.make_placed("box", "held", never),
        );
        assert!(
            cut.await.is_err(),
            "a pending make ends only by its timeout"
        );
        assert!(servers.placement("held").unwrap().is_none());
        // And a reservation removes only its own record: one written since
        // by another create stays.
        let first = a.reserve_placement("box", "again").unwrap();
        servers.unplace("again").unwrap();
        servers.place("again", "box2", Some("b")).unwrap();
        drop(first);
        assert_eq!(servers.placement("again").unwrap().unwrap().server, "box2");
        servers.unplace("again").unwrap();
        // Nothing was placed or changed by the refusals.
        assert_eq!(placed_dev(), before);
        let names: Vec<_> = servers.placements().unwrap();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_servers_answer_names_only_the_workspace_asked_for() {
        let made = |name: &str| Meta::created(name, spec(), true);
        check_made("box", "fresh", &made("fresh")).unwrap();
        // A hostile server's fork or create answer naming another
        // workspace (one here, another agent's, a path) is garbled.
        for hostile in ["../../x", "victim", "fresh.other", "", "fresh/.."] {
            let refused = check_made("box", "fresh", &made(hostile)).unwrap_err();
            assert_eq!(refused.code(), ErrorCode::Internal, "{hostile:?}");
            assert!(refused.to_string().contains("box"), "{refused}");
        }
    }
}
