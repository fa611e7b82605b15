//! A view's namespace and caller: which names it means, what it lists and
//! what it may use (the rule itself is `agents::access`), and sharing.

use std::sync::Arc;

use crate::agents::access::{may_use, Caller};
use crate::error::{Error, Result};
use crate::network::service::NetworkUsers;
use crate::workspaces::handle::Workspace;
use crate::workspaces::manager::{ListFilter, Workspaces};
use base::store::name::{full_name, validate_namespace, ALL_NAMESPACES};
use base::store::spec::{Meta, WorkspaceSpec};
use base::store::{StateDir, StoreError};

/// The namespace of the workspaces that make code kernels ahead
/// (`code_sessions::prepare`).
pub const READY_NAMESPACE: &str = "microagent-ready";

/// The pool's members, the services' companions and the makers of code
/// kernels are no one's to name.
pub(crate) fn refuse_reserved_namespace(namespace: &str) -> Result<()> {
    let what = match namespace {
        crate::pool::POOL_NAMESPACE => "pools of ready workspaces",
        base::store::spec::services::SERVICE_NAMESPACE => "workspaces' services",
        READY_NAMESPACE => "code kernels made ahead",
        _ => return Ok(()),
    };
    Err(Error::InvalidInput(format!(
        "namespace `{namespace}` is reserved for {what}"
    )))
}

impl Workspaces {
    /// The same workspaces seen from `namespace`: short names are in it
    /// and listings show it (`*`: every namespace; short names are then in
    /// the default one).
    pub fn in_namespace(&self, namespace: &str) -> Result<Self> {
        if namespace != ALL_NAMESPACES {
            validate_namespace(namespace)
                .map_err(|e| Error::InvalidInput(format!("namespace `{namespace}`: {e}")))?;
        }
        refuse_reserved_namespace(namespace)?;
        let mut view = self.clone();
        view.namespace = namespace.to_owned();
        Ok(view)
    }

    /// The same workspaces seen from reserved namespace `namespace` (the
    /// pool's or the services'), as the host: the library's own view of
    /// what it keeps there.
    pub(crate) fn reserved_view(&self, namespace: &str) -> Self {
        let mut view = self.clone();
        view.namespace = namespace.to_owned();
        view.caller = None;
        view
    }

    /// The namespace of this view.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The same workspaces seen by an MCP session: what its agent creates
    /// is its own, and other agents' things are FORBIDDEN to it.
    pub fn for_caller(&self, caller: Arc<Caller>) -> Self {
        let mut view = self.clone();
        view.caller = Some(caller);
        view
    }

    /// The session this view acts for (none: the host).
    pub fn caller(&self) -> Option<&Caller> {
        self.caller.as_deref()
    }

    /// Every workspace that matches `filter`, in every namespace and of
    /// every agent: what the host's own checks (images, volumes and
    /// networks in use) look at.
    pub(crate) fn list_everywhere(&self, filter: &ListFilter) -> Result<Vec<Meta>> {
        let mut host = self.clone();
        host.namespace = ALL_NAMESPACES.to_owned();
        host.caller = None;
        host.list(filter)
    }

    /// The full name `name` means here.
    pub(crate) fn full_name(&self, name: &str) -> Result<String> {
        let full = full_name(&self.namespace, name).map_err(StoreError::Name)?;
        // A view in a reserved namespace (the pool's, the services') is the
        // library's own and names what is in it.
        if refuse_reserved_namespace(&self.namespace).is_ok() {
            refuse_reserved_namespace(base::store::name::namespace_of(&full))?;
        }
        Ok(full)
    }

    /// `spec` as this view creates it: an agent's session owns it; a
    /// session without an agent makes it nobody's.
    pub(crate) fn owned_by_caller(&self, spec: WorkspaceSpec) -> WorkspaceSpec {
        match &self.caller {
            Some(_) => WorkspaceSpec {
                agent: self.creating_agent(),
                shared_with: Vec::new(),
                ..spec
            },
            None => spec,
        }
    }

    /// Whether this view's listings show a thing in `namespace` that
    /// `owner` owns and shared with `shared_with`: one in its namespace it
    /// may use, or with `all_agents` any agent's.
    pub(crate) fn lists(
        &self,
        namespace: &str,
        owner: Option<&str>,
        shared_with: &[String],
        all_agents: bool,
    ) -> bool {
        base::store::name::shown_in(namespace, &self.namespace)
            && (all_agents || may_use(self.caller(), owner, shared_with))
    }

    /// FORBIDDEN unless this view may use the `kind` called `name`, made
    /// with `spec`.
    pub(crate) fn check_access(
        &self,
        kind: &'static str,
        name: &str,
        spec: &WorkspaceSpec,
    ) -> Result<()> {
        self.check_owner(kind, name, spec.agent.as_deref(), &spec.shared_with)
    }

    /// FORBIDDEN unless this view may use the `kind` called `name` that
    /// `owner` owns and shared with `shared_with`.
    pub(crate) fn check_owner(
        &self,
        kind: &'static str,
        name: &str,
        owner: Option<&str>,
        shared_with: &[String],
    ) -> Result<()> {
        if may_use(self.caller(), owner, shared_with) {
            return Ok(());
        }
        Err(Error::OwnedByAnotherAgent {
            kind,
            name: name.to_owned(),
            owner: owner.unwrap_or_default().to_owned(),
        })
    }

    /// The agent what this view creates belongs to.
    pub(crate) fn creating_agent(&self) -> Option<String> {
        self.caller().and_then(Caller::agent)
    }
}

impl Workspace<'_> {
    /// Lets agent `agent` use this workspace (and snapshots taken from now
    /// on), or with `share: false` no longer. Only its owner may (or the
    /// host); a workspace no agent owns needs no sharing (INVALID_INPUT).
    pub fn share_with(self, agent: &str, share: bool) -> Result<Meta> {
        crate::agents::AgentStore::check(agent, &[]).map_err(Error::Agents)?;
        let (all, name) = (self.all, self.name.as_str());
        let (_lock, mut meta) = all.lock_existing(name)?;
        let Some(owner) = meta.spec.agent.clone() else {
            return Err(Error::InvalidInput(format!(
                "workspace `{name}` belongs to no agent: every session may use it already"
            )));
        };
        let me = all.caller().map(|c| c.agent());
        if me
            .as_ref()
            .is_some_and(|me| me.as_deref() != Some(owner.as_str()))
        {
            return Err(Error::OwnedByAnotherAgent {
                kind: "workspace",
                name: name.to_owned(),
                owner,
            });
        }
        meta.spec.shared_with.retain(|a| a != agent);
        if share && agent != owner {
            meta.spec.shared_with.push(agent.to_owned());
        }
        all.dir(name)?.write_meta(&meta)?;
        Ok(meta)
    }
}

impl NetworkUsers for Workspaces {
    type Error = Error;

    fn network_state(&self) -> &StateDir {
        self.state_dir()
    }

    fn network_users(&self) -> Result<Vec<(String, WorkspaceSpec)>> {
        Ok(self
            .list_everywhere(&ListFilter::default())?
            .into_iter()
            .map(|m| (m.name, m.spec))
            .collect())
    }

    fn host_io_error(what: String, source: std::io::Error) -> Error {
        Error::HostIo { what, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspaces::manager::tests::{fixture, have_mkfs, spec};
    use base::code::ErrorCode;
    use base::store::name::ALL_NAMESPACES;

    fn names(ws: &Workspaces, all_agents: bool) -> Vec<String> {
        let filter = ListFilter {
            all_agents,
            ..ListFilter::default()
        };
        let listed = ws.list(&filter).unwrap();
        listed.into_iter().map(|m| m.name).collect()
    }

    #[test]
    fn names_are_unique_per_namespace() {
        if !have_mkfs("names_are_unique_per_namespace") {
            return;
        }
        let f = fixture("namespaces", "/nonexistent");
        let team = f.ws.in_namespace("team-a").unwrap();
        f.ws.create("dev", spec()).unwrap();
        let made = team.create("dev", spec()).unwrap();
        assert_eq!(
            (made.name.as_str(), made.namespace.as_str()),
            ("dev.team-a", "team-a")
        );
        assert_eq!(names(&f.ws, false), ["dev"]);
        assert_eq!(names(&team, false), ["dev.team-a"]);
        let everywhere = f.ws.in_namespace(ALL_NAMESPACES).unwrap();
        assert_eq!(names(&everywhere, false), ["dev", "dev.team-a"]);
        // The short name means the view's namespace; the full one works
        // from any.
        assert_eq!(
            team.workspace("dev").unwrap().get().unwrap().name,
            "dev.team-a"
        );
        assert_eq!(f.ws.workspace("dev.team-a").unwrap().name(), "dev.team-a");
        let taken = team.create("dev", spec()).unwrap_err();
        assert_eq!(taken.code(), ErrorCode::Conflict);
        let bad = f.ws.in_namespace("Team").unwrap_err();
        assert_eq!(bad.code(), ErrorCode::InvalidInput);
        let shortcut = f.ws.workspace("dev.default").unwrap_err();
        assert_eq!(shortcut.code(), ErrorCode::InvalidInput);
    }

    #[test]
    fn the_pool_namespace_is_no_ones_to_name() {
        let f = fixture("pool-namespace", "/nonexistent");
        let pool = crate::pool::POOL_NAMESPACE;
        assert!(matches!(
            f.ws.in_namespace(pool),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            f.ws.workspace(&format!("member.{pool}")),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            f.ws.create(&format!("member.{pool}"), spec()),
            Err(Error::InvalidInput(_))
        ));
        assert!(f
            .ws
            .pools()
            .view()
            .full_name(&format!("member.{pool}"))
            .is_ok());
        // Nor a fork (or a restore as a new workspace, which is one).
        f.ws.create("dev", spec()).unwrap();
        let member = format!("m.{pool}");
        let fork =
            f.ws.at("dev")
                .fork(&member, None, std::time::Duration::from_secs(1), |_| {});
        let refused = tokio::runtime::Runtime::new().unwrap().block_on(fork);
        assert!(
            matches!(refused, Err(Error::InvalidInput(_))),
            "{refused:?}"
        );
        assert!(f.ws.at(&member).get_here().is_err());
    }

    #[test]
    fn the_code_kernel_makers_namespace_is_no_ones_to_name() {
        let f = fixture("ready-namespace", "/nonexistent");
        let ready = READY_NAMESPACE;
        assert!(matches!(
            f.ws.in_namespace(ready),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            f.ws.create(&format!("maker.{ready}"), spec()),
            Err(Error::InvalidInput(_))
        ));
        assert!(f
            .ws
            .reserved_view(ready)
            .full_name(&format!("maker.{ready}"))
            .is_ok());
        if !have_mkfs("the_code_kernel_makers_namespace_is_no_ones_to_name") {
            return;
        }
        // The host sees a maker in every namespace's listing; no agent does.
        let maker = format!("maker.{ready}");
        f.ws.reserved_view(ready).create(&maker, spec()).unwrap();
        let everywhere = f.ws.in_namespace(ALL_NAMESPACES).unwrap();
        let names = |ws: &Workspaces| -> Vec<String> {
            let all = ListFilter {
                all_agents: true,
                ..ListFilter::default()
            };
            ws.list(&all).unwrap().into_iter().map(|m| m.name).collect()
        };
        assert_eq!(names(&everywhere), [maker]);
        let agent = everywhere.for_caller(Arc::new(Caller::new()));
        assert!(names(&agent).is_empty());
    }

    #[test]
    fn a_listing_filters_by_the_owning_agent() {
        if !have_mkfs("a_listing_filters_by_the_owning_agent") {
            return;
        }
        let f = fixture("list-by-agent", "/nonexistent");
        let a = f.ws.for_caller(Arc::new(Caller::new()));
        a.caller().unwrap().set_agent("a");
        let b = f.ws.for_caller(Arc::new(Caller::new()));
        b.caller().unwrap().set_agent("b");
        a.create("a-box", spec()).unwrap();
        b.create("b-box", spec()).unwrap();
        f.ws.create("host-box", spec()).unwrap();
        let by = |ws: &Workspaces, agent: &str| -> Vec<String> {
            let filter = ListFilter {
                agent: Some(agent.to_owned()),
                ..ListFilter::default()
            };
            ws.list(&filter)
                .unwrap()
                .into_iter()
                .map(|m| m.name)
                .collect()
        };
        // Another agent's are listed by their owner's name (using them
        // stays FORBIDDEN); the host's match no agent.
        assert_eq!(by(&b, "a"), ["a-box"]);
        assert_eq!(by(&f.ws, "b"), ["b-box"]);
        assert!(by(&f.ws, "nobody").is_empty());
        assert_eq!(names(&b, false), ["b-box", "host-box"]);
    }

    #[test]
    fn volumes_and_tasks_are_their_agents() {
        if !have_mkfs("volumes_and_tasks_are_their_agents") {
            return;
        }
        let f = fixture("owned-volumes", "/nonexistent");
        let a = f.ws.for_caller(Arc::new(Caller::new()));
        a.caller().unwrap().set_agent("a");
        let b = f.ws.for_caller(Arc::new(Caller::new()));
        b.caller().unwrap().set_agent("b");
        let empty = base::volumes::VolumeSource::Empty;
        let made = a.volumes().create("va", Some(16), &empty).unwrap();
        assert_eq!(made.agent.as_deref(), Some("a"));
        assert_eq!(
            b.volumes().inspect("va").unwrap_err().code(),
            ErrorCode::Forbidden
        );
        assert_eq!(
            b.volumes().delete("va", true).unwrap_err().code(),
            ErrorCode::Forbidden
        );
        assert!(b.volumes().list(false).unwrap().is_empty());
        assert_eq!(b.volumes().list(true).unwrap().len(), 1);
        let mounts = base::store::spec::WorkspaceSpec {
            volumes: vec![base::store::volume_mounts::VolumeMount {
                name: "va".into(),
                path: "/data".into(),
                read_only: true,
                own_copy: false,
            }],
            ..spec()
        };
        let refused = b.create("borrower", mounts.clone()).unwrap_err();
        assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
        // In a namespace, a short volume name is that namespace's.
        let team = a.in_namespace("team-a").unwrap();
        team.volumes().create("va", Some(16), &empty).unwrap();
        let made = team.create("user", mounts).unwrap();
        assert_eq!(made.spec.volumes[0].name, "va.team-a");

        let mut task = crate::tasks::tests::info("t1", 1);
        task.agent = Some("a".into());
        f.ws.tasks().store().insert(&task).unwrap();
        assert_eq!(
            b.tasks().info("t1").unwrap_err().code(),
            ErrorCode::Forbidden
        );
        assert!(b.tasks().list(false).unwrap().is_empty());
        assert_eq!(b.tasks().list(true).unwrap().len(), 1);
        assert_eq!(a.tasks().list(false).unwrap().len(), 1);
        assert!(
            team.tasks().list(false).unwrap().is_empty(),
            "another namespace"
        );
    }

    #[test]
    fn agents_own_what_their_sessions_make() {
        if !have_mkfs("agents_own_what_their_sessions_make") {
            return;
        }
        let f = fixture("owners", "/nonexistent");
        let session = |agent| crate::workspaces::manager::tests::session(&f.ws, agent);
        let (a, b, anonymous) = (session(Some("a")), session(Some("b")), session(None));
        let made = a.create("mine", spec()).unwrap();
        assert_eq!(made.spec.agent.as_deref(), Some("a"));
        anonymous.create("common", spec()).unwrap();
        let refused = b.workspace("mine").unwrap_err();
        assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
        assert_eq!(
            anonymous.workspace("mine").unwrap_err().code(),
            ErrorCode::Forbidden
        );
        assert_eq!(names(&b, false), ["common"]);
        assert_eq!(names(&b, true), ["common", "mine"], "listed, still refused");
        assert_eq!(names(&f.ws, false), ["common", "mine"], "the host sees all");
        let snap = a
            .workspace("mine")
            .unwrap()
            .snapshot_take(Some("s1"))
            .unwrap();
        assert_eq!(
            b.snapshots().get(&snap.name).unwrap_err().code(),
            ErrorCode::Forbidden
        );
        assert_eq!(
            b.snapshots().delete(&snap.name).unwrap_err().code(),
            ErrorCode::Forbidden
        );
        assert!(b.snapshots().list(None, false).unwrap().is_empty());
        assert_eq!(b.snapshots().list(None, true).unwrap().len(), 1);
        assert_eq!(a.snapshots().list(None, false).unwrap().len(), 1);
        // Only the owner shares.
        let not_owner = b
            .workspace("common")
            .unwrap()
            .share_with("b", true)
            .unwrap_err();
        assert_eq!(not_owner.code(), ErrorCode::InvalidInput);
        a.workspace("mine").unwrap().share_with("b", true).unwrap();
        assert_eq!(
            b.workspace("mine").unwrap().get().unwrap().spec.shared_with,
            ["b"]
        );
        let reshare = b
            .workspace("mine")
            .unwrap()
            .share_with("c", true)
            .unwrap_err();
        assert_eq!(reshare.code(), ErrorCode::Forbidden);
        a.workspace("mine").unwrap().share_with("b", false).unwrap();
        assert_eq!(
            b.workspace("mine").unwrap_err().code(),
            ErrorCode::Forbidden
        );
        // Nobody else's record changes hands: an agent making a workspace
        // cannot name another owner.
        let claimed = base::store::spec::WorkspaceSpec {
            agent: Some("a".into()),
            ..spec()
        };
        assert_eq!(
            b.create("claim", claimed).unwrap().spec.agent.as_deref(),
            Some("b")
        );
    }

    #[test]
    fn an_in_place_restore_never_reaches_a_name_another_agent_took_since() {
        if !have_mkfs("an_in_place_restore_never_reaches_a_name_another_agent_took_since") {
            return;
        }
        let f = fixture("retaken", "/nonexistent");
        let session = |agent| crate::workspaces::manager::tests::session(&f.ws, agent);
        let (a, b) = (session(Some("a")), session(Some("b")));
        a.create("w", spec()).unwrap();
        let snap = a.workspace("w").unwrap().snapshot_take(Some("s1")).unwrap();
        a.workspace("w")
            .unwrap()
            .delete(base::store::spec::DeleteOptions::default().force(true))
            .unwrap();
        let theirs = b.create("w", spec()).unwrap();
        let disk = f.ws.dir(&theirs.name).unwrap().disk();
        std::fs::write(&disk, b"b's data").unwrap();
        let restore = a.snapshots().restore(
            &snap.name,
            None,
            true,
            std::time::Duration::from_secs(5),
            |_| {},
        );
        let refused = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(restore)
            .unwrap_err();
        assert_eq!(refused.code(), ErrorCode::Forbidden, "{refused}");
        assert_eq!(std::fs::read(&disk).unwrap(), b"b's data");
    }
}
