//! A workspace's own egress policy (on the `user` network): recorded in
//! its spec, put in force by its VMM's filter at once when it runs, and
//! what that filter refused.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::workspaces::handle::Workspace;
use base::store::egress::{AllowEntry, Egress, EgressDenials};
use base::store::spec::Meta;
use base::vmm::control::{self, ControlRequest, ControlResponse};

/// How long a control call about the policy may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// A workspace's own egress policy (`dev.egress()`). `Copy`; its calls take it by value, as the handle's do.
#[derive(Clone, Copy, Debug)]
pub struct WorkspaceEgress<'a> {
    ws: Workspace<'a>,
}

impl<'a> Workspace<'a> {
    /// This workspace's own egress policy.
    pub fn egress(self) -> WorkspaceEgress<'a> {
        WorkspaceEgress { ws: self }
    }
}

impl WorkspaceEgress<'_> {
    /// Sets its egress mode (`None`: its network's) and its own rules,
    /// replacing the ones it had: recorded for every start, and in force
    /// for new connections at once when it runs. Invalid rules, or rules
    /// its network cannot take, change nothing.
    pub fn set(self, egress: Option<Egress>, allow: Vec<AllowEntry>) -> Result<Meta> {
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        let ws = all.dir(name)?;
        let meta = self.ws.get_here()?;
        let mut spec = meta.spec.clone();
        spec.egress = egress;
        spec.allow = allow;
        let net = all.networks().store().get(&spec.network)?;
        base::network::user_filter::validate_workspace_policy(&net, &spec)?;
        if meta.state.has_vmm() {
            let (egress, allow) = base::network::attach::policy(&net, &spec);
            match control::call(
                &ws.control(),
                &ControlRequest::SetEgress { egress, allow },
                CONTROL_TIMEOUT,
            )? {
                ControlResponse::Ok { .. } => {}
                ControlResponse::Error { message } => return Err(Error::InvalidInput(message)),
                other => return Err(unexpected(&other)),
            }
        }
        let (_lock, mut meta) = all.lock_existing(name)?;
        meta.spec.egress = spec.egress;
        meta.spec.allow = spec.allow;
        ws.write_meta(&meta)?;
        Ok(meta)
    }

    /// What its egress filter refused, when it runs on the `user` network
    /// (`None` otherwise: stopped, or no filter of ours).
    pub fn denials(self) -> Result<Option<EgressDenials>> {
        let ws = self.ws.all.dir(&self.ws.name)?;
        if !self.ws.get_here()?.state.has_vmm() {
            return Ok(None);
        }
        match control::call(
            &ws.control(),
            &ControlRequest::EgressDenials,
            CONTROL_TIMEOUT,
        )? {
            ControlResponse::EgressDenials { denied, denials } => {
                Ok(Some(EgressDenials { denied, denials }))
            }
            ControlResponse::Error { .. } => Ok(None),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(resp: &ControlResponse) -> Error {
    Error::InvalidInput(format!("unexpected answer from the VMM: {resp:?}"))
}
