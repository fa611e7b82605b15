//! Networks through [`Workspaces`]: create, list, inspect and delete them
//! (a network in use is kept), place a new workspace on its network, and
//! set up or tear down the host's networking (preview-then-confirm).

use crate::network::setup::HostChange;
use crate::network::{GuestNetwork, NetworkInfo};

use crate::error::Result;
use crate::host::settings::now_ms;
use crate::network::{
    setup, Backend, Network, NetworkError, NetworkRequest, Networks, NetworksLock,
};
use crate::store::spec::WorkspaceSpec;
use crate::workspaces::manager::{ListFilter, Workspaces};

impl Workspaces {
    /// Where `meta`'s guest is on its network.
    pub(crate) fn guest_network(&self, meta: &crate::store::spec::Meta) -> Option<GuestNetwork> {
        let net = self.networks().get(&meta.spec.network).ok()?;
        let addressing = crate::network::attach::addressing(&net, &meta.spec)?;
        let (egress, allow) = crate::network::attach::policy(&net, &meta.spec);
        Some(GuestNetwork {
            backend: net.backend?,
            egress,
            allow,
            name: net.name,
            addressing,
            mac: guest_agent::client::blocking::format_mac(crate::network::mac_for(&meta.name)),
        })
    }

    /// The networks of this state directory.
    pub fn networks(&self) -> Networks {
        Networks::new(self.state_dir())
    }

    fn users_of(&self, network: &str) -> Result<Vec<(String, WorkspaceSpec)>> {
        Ok(self
            .list_everywhere(&ListFilter::default())?
            .into_iter()
            .filter(|m| m.spec.network == network)
            .map(|m| (m.name, m.spec))
            .collect())
    }

    fn info(&self, network: Network) -> Result<NetworkInfo> {
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
    pub fn create_network(&self, name: &str, req: &NetworkRequest) -> Result<NetworkInfo> {
        let nets = self.networks();
        // Refused requests leave the state directory as it was (no lock
        // file either).
        crate::network::objects::check_new(name, req)?;
        let _lock = nets.lock()?;
        let net = nets.create(name, req, now_ms())?;
        self.info(net)
    }

    /// Every network and its workspaces.
    pub fn list_networks(&self) -> Result<Vec<NetworkInfo>> {
        self.networks()
            .list()?
            .into_iter()
            .map(|n| self.info(n))
            .collect()
    }

    /// One network and its workspaces.
    pub fn inspect_network(&self, name: &str) -> Result<NetworkInfo> {
        let net = self.networks().get(name)?;
        self.info(net)
    }

    /// Deletes a network no workspace names (CONFLICT otherwise); with
    /// `preview` it only checks and returns what would go.
    pub fn delete_network(&self, name: &str, preview: bool) -> Result<NetworkInfo> {
        let nets = self.networks();
        let _lock = nets.lock()?;
        let info = self.inspect_network(name)?;
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
    pub(crate) fn place_on_network(
        &self,
        spec: WorkspaceSpec,
    ) -> Result<(NetworksLock, WorkspaceSpec)> {
        let nets = self.networks();
        let lock = nets.lock()?;
        let net = nets.get(&spec.network)?;
        crate::network::user_filter::validate_workspace_policy(&net, &spec)?;
        let address = match net.backend {
            Some(Backend::Tap) => {
                let taken: Vec<_> = self
                    .users_of(&net.name)?
                    .into_iter()
                    .filter_map(|(_, s)| s.address)
                    .collect();
                Some(crate::network::attach::free_address(&net, &taken)?)
            }
            _ => None,
        };
        Ok((lock, WorkspaceSpec { address, ..spec }))
    }

    fn networks_dir(&self) -> std::path::PathBuf {
        self.state_dir()
            .root()
            .join(crate::network::objects::NETWORKS_DIR)
    }

    fn host_change(
        &self,
        plan: crate::host::plan::Plan,
        confirm: Option<&str>,
        applied_record: Option<String>,
    ) -> Result<HostChange> {
        let confirmer = crate::host::confirm::Confirmer::open(self.state_dir().root())?;
        let Some(token) = confirm else {
            return Ok(HostChange {
                preview: confirmer.preview(plan, now_ms()),
                applied: false,
            });
        };
        confirmer.check(&plan, token, now_ms())?;
        if !plan.steps.is_empty() && !crate::host::plan::has_cap_net_admin() {
            return Err(crate::host::plan::PlanError::Privilege {
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
                std::fs::create_dir_all(self.networks_dir()).map_err(
                    crate::error::Error::host_io(format!(
                        "creating {}",
                        self.networks_dir().display()
                    )),
                )?;
                crate::store::write_json_atomic(
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
            preview: crate::host::plan::Preview {
                plan,
                token: None,
                expires_at_ms: None,
            },
            applied: true,
        })
    }

    /// Previews (without `confirm`) or applies (with the preview's token)
    /// the host setup of the `tap` networks.
    pub fn network_setup(&self, confirm: Option<&str>) -> Result<HostChange> {
        if let Some(token) = confirm {
            crate::host::confirm::Confirmer::expect_issued(self.state_dir().root(), token)?;
        }
        let _lock = self.networks().lock()?;
        let nets = self.networks().list()?;
        let want = setup::Desired::of(&nets, &self.networks_dir(), &setup::host_resolvers());
        let plan = setup::setup_plan(&want, &setup::probe(&self.networks_dir()));
        self.host_change(plan, confirm, Some(want.digest()))
    }

    /// Previews or applies the removal of everything the setup made.
    pub fn network_teardown(&self, confirm: Option<&str>) -> Result<HostChange> {
        if let Some(token) = confirm {
            crate::host::confirm::Confirmer::expect_issued(self.state_dir().root(), token)?;
        }
        let _lock = self.networks().lock()?;
        let plan = setup::teardown_plan(&setup::probe(&self.networks_dir()));
        self.host_change(plan, confirm, None)
    }

    /// Whether the host matches the `tap` networks (`None`: there are
    /// none).
    pub fn network_setup_applied(&self) -> Result<Option<bool>> {
        let nets = self.networks().list()?;
        let want = setup::Desired::of(&nets, &self.networks_dir(), &setup::host_resolvers());
        if want.taps.is_empty() {
            return Ok(None);
        }
        Ok(Some(want.is_applied(&setup::probe(&self.networks_dir()))))
    }
}
