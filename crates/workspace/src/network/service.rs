//! The network calls the collection hands out (`ws.networks()`): create,
//! list, inspect and delete networks (a network in use is kept), place a
//! new workspace on its network, and set up or tear down the host's
//! networking (preview-then-confirm).
//!
//! The workspaces that use a network are above this folder, so the calls
//! reach them through [`NetworkUsers`], which the collection implements;
//! the calls return the collection's error.

use std::path::PathBuf;

use crate::host::confirm::{ConfirmError, Confirmer};
use crate::network::setup::{self, HostChange};
use base::host::plan::{Plan, PlanError, Preview};
use base::host::settings::now_ms;
use base::network::objects::{check_new, NETWORKS_DIR};
use base::network::{
    Backend, GuestNetwork, Network, NetworkError, NetworkInfo, NetworkRequest, NetworkStore,
    NetworksLock,
};
use base::store::spec::{Meta, WorkspaceSpec};
use base::store::{StateDir, StoreError};

/// What the network calls need from the workspaces above them.
pub trait NetworkUsers {
    /// The error the calls return; each lower error keeps the variant
    /// callers have always seen.
    type Error: From<NetworkError> + From<StoreError> + From<PlanError> + From<ConfirmError>;

    /// The state directory the networks are recorded in.
    fn network_state(&self) -> &StateDir;

    /// Every workspace in every namespace, by full name, with its spec.
    fn network_users(&self) -> Result<Vec<(String, WorkspaceSpec)>, Self::Error>;

    /// A host-side file operation that failed while `what`.
    fn host_io_error(what: String, source: std::io::Error) -> Self::Error;
}

/// The networks of a collection of workspaces (`ws.networks()`).
pub struct Networks<'a, U: NetworkUsers> {
    users: &'a U,
}

impl<U: NetworkUsers> std::fmt::Debug for Networks<'_, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Networks")
            .field("state", &self.users.network_state().root())
            .finish()
    }
}

impl<'a, U: NetworkUsers> Networks<'a, U> {
    pub(crate) fn new(users: &'a U) -> Self {
        Self { users }
    }

    /// The records of the networks.
    pub(crate) fn store(&self) -> NetworkStore {
        NetworkStore::new(self.users.network_state())
    }

    /// Where `meta`'s guest is on its network.
    pub(crate) fn guest(&self, meta: &Meta) -> Option<GuestNetwork> {
        let net = self.store().get(&meta.spec.network).ok()?;
        let addressing = base::network::attach::addressing(&net, &meta.spec)?;
        let (egress, allow) = base::network::attach::policy(&net, &meta.spec);
        Some(GuestNetwork {
            backend: net.backend?,
            egress,
            allow,
            name: net.name,
            addressing,
            mac: guest_agent::client::blocking::format_mac(base::network::mac_for(&meta.name)),
        })
    }

    fn users_of(&self, network: &str) -> Result<Vec<(String, WorkspaceSpec)>, U::Error> {
        Ok(self
            .users
            .network_users()?
            .into_iter()
            .filter(|(_, spec)| spec.network == network)
            .collect())
    }

    fn info(&self, network: Network) -> Result<NetworkInfo, U::Error> {
        let workspaces = self
            .users_of(&network.name)?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        Ok(NetworkInfo {
            bridge: network.bridge(),
            gateway: network.gateway(),
            network,
            workspaces,
        })
    }

    /// Creates a network.
    pub fn create(&self, name: &str, req: &NetworkRequest) -> Result<NetworkInfo, U::Error> {
        let nets = self.store();
        // Refused requests leave the state directory as it was (no lock
        // file either).
        check_new(name, req)?;
        let _lock = nets.lock()?;
        let net = nets.create(name, req, now_ms())?;
        self.info(net)
    }

    /// Every network and its workspaces.
    pub fn list(&self) -> Result<Vec<NetworkInfo>, U::Error> {
        self.store()
            .list()?
            .into_iter()
            .map(|n| self.info(n))
            .collect()
    }

    /// One network and its workspaces.
    pub fn inspect(&self, name: &str) -> Result<NetworkInfo, U::Error> {
        let net = self.store().get(name)?;
        self.info(net)
    }

    /// Deletes a network no workspace names (CONFLICT otherwise); with
    /// `preview` it only checks and returns what would go.
    pub fn delete(&self, name: &str, preview: bool) -> Result<NetworkInfo, U::Error> {
        let nets = self.store();
        let _lock = nets.lock()?;
        let info = self.inspect(name)?;
        if info.network.builtin {
            return Err(NetworkError::BuiltIn(name.to_owned()).into());
        }
        if !info.workspaces.is_empty() {
            return Err(NetworkError::InUse {
                name: name.to_owned(),
                workspaces: info.workspaces,
            }
            .into());
        }
        if !preview {
            nets.remove(name, Vec::new())?;
        }
        Ok(info)
    }

    /// Checks that `spec`'s network exists and gives its guest an address
    /// on a `tap` network. The returned lock keeps the network (and the
    /// address) until the caller has written the workspace's record.
    pub(crate) fn place(
        &self,
        spec: WorkspaceSpec,
    ) -> Result<(NetworksLock, WorkspaceSpec), U::Error> {
        let nets = self.store();
        let lock = nets.lock()?;
        let net = nets.get(&spec.network)?;
        base::network::user_filter::validate_workspace_policy(&net, &spec)?;
        let address = match net.backend {
            Some(Backend::Tap) => {
                let taken: Vec<_> = self
                    .users_of(&net.name)?
                    .into_iter()
                    .filter_map(|(_, s)| s.address)
                    .collect();
                Some(base::network::attach::free_address(&net, &taken)?)
            }
            _ => None,
        };
        Ok((lock, WorkspaceSpec { address, ..spec }))
    }

    fn networks_dir(&self) -> PathBuf {
        self.users.network_state().root().join(NETWORKS_DIR)
    }

    fn host_change(
        &self,
        plan: Plan,
        confirm: Option<&str>,
        applied_record: Option<String>,
    ) -> Result<HostChange, U::Error> {
        let confirmer = Confirmer::open(self.users.network_state().root())?;
        let Some(token) = confirm else {
            return Ok(HostChange {
                preview: confirmer.preview(plan, now_ms()),
                applied: false,
            });
        };
        confirmer.check(&plan, token, now_ms())?;
        if !plan.steps.is_empty() && !base::host::plan::has_cap_net_admin() {
            return Err(PlanError::Privilege {
                needs: "CAP_NET_ADMIN (root)",
                action: plan.action,
                token: token.to_owned(),
            }
            .into());
        }
        confirmer.spend(token, now_ms())?;
        plan.run()?;
        let record = self.networks_dir().join(setup::APPLIED_FILE);
        match applied_record {
            Some(digest) => {
                std::fs::create_dir_all(self.networks_dir()).map_err(|source| {
                    U::host_io_error(
                        format!("creating {}", self.networks_dir().display()),
                        source,
                    )
                })?;
                base::store::write_json_atomic(
                    &record,
                    &setup::Applied {
                        digest,
                        at_ms: now_ms(),
                    },
                )?;
            }
            None => {
                let _ = std::fs::remove_file(&record);
            }
        }
        Ok(HostChange {
            preview: Preview {
                plan,
                token: None,
                expires_at_ms: None,
            },
            applied: true,
        })
    }

    /// Previews (without `confirm`) or applies (with the preview's token)
    /// the host setup of the `tap` networks.
    pub fn setup(&self, confirm: Option<&str>) -> Result<HostChange, U::Error> {
        if let Some(token) = confirm {
            Confirmer::expect_issued(self.users.network_state().root(), token)?;
        }
        let _lock = self.store().lock()?;
        let nets = self.store().list()?;
        let want = setup::Desired::of(&nets, &self.networks_dir(), &setup::host_resolvers());
        let plan = setup::setup_plan(&want, &setup::probe(&self.networks_dir()));
        self.host_change(plan, confirm, Some(want.digest()))
    }

    /// Previews or applies the removal of everything the setup made.
    pub fn teardown(&self, confirm: Option<&str>) -> Result<HostChange, U::Error> {
        if let Some(token) = confirm {
            Confirmer::expect_issued(self.users.network_state().root(), token)?;
        }
        let _lock = self.store().lock()?;
        let plan = setup::teardown_plan(&setup::probe(&self.networks_dir()));
        self.host_change(plan, confirm, None)
    }

    /// Whether the host matches the `tap` networks (`None`: there are
    /// none).
    pub fn setup_applied(&self) -> Result<Option<bool>, U::Error> {
        let nets = self.store().list()?;
        let want = setup::Desired::of(&nets, &self.networks_dir(), &setup::host_resolvers());
        if want.taps.is_empty() {
            return Ok(None);
        }
        Ok(Some(want.is_applied(&setup::probe(&self.networks_dir()))))
    }
}
