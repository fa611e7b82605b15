//! Publishing and unpublishing a workspace's ports: recorded in its spec,
//! and asked of its VMM process when it runs.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::workspaces::handle::Workspace;
use base::store::ports::{check_free, validate, PortMapping};
use base::store::spec::Meta;
use base::vmm::control::{self, ControlRequest, ControlResponse};

/// How long a control call about ports may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// A workspace's published ports (`dev.ports()`). `Copy`; its calls take it by value, as the handle's do.
#[derive(Clone, Copy, Debug)]
pub struct WorkspacePorts<'a> {
    ws: Workspace<'a>,
}

impl<'a> Workspace<'a> {
    /// This workspace's published ports.
    pub fn ports(self) -> WorkspacePorts<'a> {
        WorkspacePorts { ws: self }
    }
}

impl WorkspacePorts<'_> {
    /// Publishes `mapping` on it: at once when it is running (this
    /// process binds the address and hands the socket to its VMM, which
    /// listens before this returns), and at every start. A host address in
    /// use, or published to another guest port, changes nothing; the same
    /// mapping again is done already.
    pub fn publish(self, mapping: PortMapping) -> Result<Meta> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(
                remote.call_blocking(crate::servers::WorkspaceCall::PublishPort { mapping })?
            );
        }
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        let ws = all.dir(name)?;
        let meta = self.ws.get_here()?;
        if meta.spec.ports.contains(&mapping) {
            return Ok(meta);
        }
        let mut ports = meta.spec.ports.clone();
        ports.push(mapping);
        validate(&ports)?;
        if meta.state.has_vmm() {
            // Bound here and handed over: the VMM opens no internet socket
            // once it runs (docs/security.md).
            let listener = base::store::ports::bind(&mapping)?;
            expect_ok(control::call_with_fd(
                &ws.control(),
                &ControlRequest::Publish { mapping },
                std::os::fd::AsFd::as_fd(&listener),
                CONTROL_TIMEOUT,
            )?)?;
        } else {
            check_free(&[mapping])?;
        }
        let (_lock, mut meta) = all.lock_existing(name)?;
        if !meta.spec.ports.contains(&mapping) {
            meta.spec.ports.push(mapping);
        }
        ws.write_meta(&meta)?;
        Ok(meta)
    }

    /// Stops publishing the host address `host_ip`:`host_port` of it (open connections run on). NOT_FOUND when it is not published.
    pub fn unpublish(self, host_ip: IpAddr, host_port: u16) -> Result<Meta> {
        if let Some(remote) = self.ws.remote()? {
            let meta = remote.call_blocking(crate::servers::WorkspaceCall::UnpublishPort {
                host_ip,
                host_port,
            })?;
            // A forward here to a port no longer published leads nowhere.
            self.ws
                .all
                .servers()
                .unforward_port(self.ws.name(), host_port)?;
            return Ok(meta);
        }
        let (all, name) = (self.ws.all, self.ws.name.as_str());
        let ws = all.dir(name)?;
        let meta = self.ws.get_here()?;
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
        let (_lock, mut meta) = all.lock_existing(name)?;
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
