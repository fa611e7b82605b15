//! Publishing and unpublishing a workspace's ports: recorded in its spec,
//! and asked of its VMM process when it runs.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::store::ports::{check_free, validate, PortMapping};
use crate::store::spec::Meta;
use crate::vmm::control::{self, ControlRequest, ControlResponse};
use crate::workspaces::manager::Workspaces;

/// How long a control call about ports may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

impl Workspaces {
    // The implementation of [`Workspace::publish_port`].
    pub(crate) fn publish_port(&self, name: &str, mapping: PortMapping) -> Result<Meta> {
        let ws = self.dir(name)?;
        let meta = self.get(name)?;
        let mut ports = meta.spec.ports.clone();
        ports.push(mapping);
        validate(&ports)?;
        if meta.state.has_vmm() {
            expect_ok(control::call(
                &ws.control(),
                &ControlRequest::Publish { mapping },
                CONTROL_TIMEOUT,
            )?)?;
        } else {
            check_free(&[mapping])?;
        }
        let (_lock, mut meta) = self.lock_existing(name)?;
        if !meta.spec.ports.contains(&mapping) {
            meta.spec.ports.push(mapping);
        }
        ws.write_meta(&meta)?;
        Ok(meta)
    }

    // The implementation of [`Workspace::unpublish_port`].
    pub(crate) fn unpublish_port(
        &self,
        name: &str,
        host_ip: IpAddr,
        host_port: u16,
    ) -> Result<Meta> {
        let ws = self.dir(name)?;
        let meta = self.get(name)?;
        let addr = SocketAddr::new(host_ip, host_port);
        if !meta.spec.ports.iter().any(|p| p.host_addr() == addr) {
            return Err(Error::PortNotPublished {
                workspace: name.to_owned(),
                addr,
            });
        }
        if meta.state.has_vmm() {
            expect_ok(control::call(
                &ws.control(),
                &ControlRequest::Unpublish { host_ip, host_port },
                CONTROL_TIMEOUT,
            )?)?;
        }
        let (_lock, mut meta) = self.lock_existing(name)?;
        meta.spec.ports.retain(|p| p.host_addr() != addr);
        ws.write_meta(&meta)?;
        Ok(meta)
    }
}

fn expect_ok(resp: ControlResponse) -> Result<()> {
    match resp {
        ControlResponse::Ok { .. } => Ok(()),
        ControlResponse::PortUnavailable {
            addr,
            in_use,
            message,
        } => {
            let kind = if in_use {
                std::io::ErrorKind::AddrInUse
            } else {
                std::io::ErrorKind::AddrNotAvailable
            };
            Err(Error::PortUnavailable {
                addr,
                source: std::io::Error::new(kind, message),
            })
        }
        other => Err(Error::InvalidInput(format!(
            "unexpected answer from the VMM: {other:?}"
        ))),
    }
}
