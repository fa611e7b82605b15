//! A workspace's services (`base::store::services`): each a companion
//! workspace in the reserved namespace, created, started, stopped and
//! deleted with its workspace, its command a background process
//! [`SERVICE_PROCESS`], and reached from the workspace's guest by name once
//! the workspace's agent has its forwards. The collection sits above this
//! folder (its create, start, stop and delete drive it), so these calls
//! reach it through [`ServiceHost`], which it implements
//! (`snapshots/service_host.rs`, above the start and the guest).

use std::future::Future;

use crate::error::{Error, Result};
use base::images::oci::config::ImageDefaults;
use base::store::services::{companion_name, guest_addr, routes, ServiceSpec, Serving};
use base::store::spec::{Meta, Owner, WorkspaceSpec};
use base::store::state::State;
use guest_agent::protocol::Forward;

/// The id of a service's command among its companion's background
/// processes (`process output`, `logs --service`).
pub const SERVICE_PROCESS: &str = "service";

/// The collection of workspaces as a workspace's services use it.
pub(crate) trait ServiceHost {
    /// Creates stopped companion `name` (a full name) of `spec`.
    fn create_companion(&self, name: &str, spec: WorkspaceSpec) -> Result<()>;

    /// Workspace or companion `name`'s record.
    fn record_of(&self, name: &str) -> Result<Meta>;

    /// What a workspace of image `image` gets when it names nothing: its
    /// command and sizes.
    fn service_defaults(&self, image: &str) -> ImageDefaults;

    /// Stops companion `name` when it runs, at once (its VMM torn down).
    fn halt_companion(&self, name: &str) -> Result<()>;

    /// Deletes companion `name`, halted first; one that is gone is fine.
    fn delete_companion(&self, name: &str) -> Result<()>;

    /// Starts companion `name` for the process `owner` (its VMM ends with
    /// it) and runs `command` in it as [`SERVICE_PROCESS`].
    fn start_companion(
        &self,
        name: &str,
        owner: Option<Owner>,
        command: Vec<String>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Gives running workspace `name`'s guest `forwards`, replacing its
    /// own.
    fn give_forwards(
        &self,
        name: &str,
        forwards: Vec<Forward>,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// What `inspect` shows of a service.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ServiceInfo {
    /// Its name (the host name the workspace's guest reaches it by).
    pub name: String,
    /// Its image.
    pub image: String,
    /// Its ports.
    pub ports: Vec<u16>,
    /// Its address in the workspace's guest.
    pub address: std::net::Ipv4Addr,
    /// Its companion's full name.
    pub companion: String,
    /// Its companion's state (`missing` when its record is gone).
    pub state: String,
}

fn failed(service: &ServiceSpec) -> impl FnOnce(Error) -> Error + '_ {
    move |e| Error::Service {
        service: service.name.clone(),
        source: Box::new(e),
    }
}

/// The spec of service `index` of workspace `workspace` (a full name)
/// whose own spec is `of`: no network (it is reached only through its
/// relays), the workspace's agent and the sizes its image gives.
fn companion_spec(
    workspace: &str,
    of: &WorkspaceSpec,
    index: usize,
    sized: &ImageDefaults,
) -> WorkspaceSpec {
    let service = &of.services[index];
    WorkspaceSpec {
        image: service.image.clone(),
        vcpus: sized.vcpus_or(None),
        mem_mib: sized.mem_mib_or(None),
        env: service.env.clone(),
        network: base::store::name::NO_NETWORK.to_owned(),
        service_ports: service.ports.clone(),
        serving: Some(Serving {
            workspace: workspace.to_owned(),
            index,
            service: service.name.clone(),
        }),
        labels: [
            ("microagent.service".to_owned(), service.name.clone()),
            ("microagent.serves".to_owned(), workspace.to_owned()),
        ]
        .into(),
        agent: of.agent.clone(),
        ..WorkspaceSpec::default()
    }
}

/// The command service `service` runs: its own, else its image's.
fn command_of(host: &impl ServiceHost, service: &ServiceSpec) -> Result<Vec<String>> {
    if !service.command.is_empty() {
        return Ok(service.command.clone());
    }
    host.service_defaults(&service.image)
        .command
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "service `{}`: image `{}` names no command; give one",
                service.name, service.image
            ))
        })
}

/// Creates the companions of new workspace `workspace` (its spec `spec`);
/// on a failure, those made are deleted again and the failure names the
/// service.
pub(crate) fn create_all(
    host: &impl ServiceHost,
    workspace: &str,
    spec: &WorkspaceSpec,
) -> Result<()> {
    let mut made = Vec::new();
    let result = spec
        .services
        .iter()
        .enumerate()
        .try_for_each(|(i, service)| {
            let name = companion_name(workspace, &service.name);
            let sized = host.service_defaults(&service.image);
            command_of(host, service)
                .and_then(|_| {
                    host.create_companion(&name, companion_spec(workspace, spec, i, &sized))
                })
                .map_err(failed(service))?;
            made.push(name);
            Ok(())
        });
    if result.is_err() {
        for name in made {
            let _ = host.delete_companion(&name);
        }
    }
    result
}

/// Starts the services of running workspace `workspace` (its record
/// `meta`), each owned by the workspace's VMM, then gives its guest their
/// names. A service that fails stops the others; the failure names it.
pub(crate) async fn start_all(host: &impl ServiceHost, meta: &Meta) -> Result<()> {
    let spec = &meta.spec;
    if spec.services.is_empty() {
        return Ok(());
    }
    let owner = meta.runtime.as_ref().and_then(|r| {
        base::store::process::start_ticks(r.pid).map(|start_ticks| Owner {
            pid: r.pid,
            start_ticks,
        })
    });
    for service in &spec.services {
        let name = companion_name(&meta.name, &service.name);
        let started = async {
            let command = command_of(host, service)?;
            host.start_companion(&name, owner, command).await
        };
        if let Err(e) = started.await {
            halt_all(host, &meta.name, spec);
            return Err(failed(service)(e));
        }
    }
    let forwards = routes(&spec.services)
        .map(|(i, service, port, vsock_port)| Forward {
            name: service.name.clone(),
            addr: guest_addr(i),
            port,
            vsock_port,
        })
        .collect();
    let given = host.give_forwards(&meta.name, forwards).await;
    if given.is_err() {
        halt_all(host, &meta.name, spec);
    }
    given
}

/// Stops the services of workspace `workspace` at once (its VMM has
/// stopped or is going: they serve nothing any more). Every one is tried;
/// the first failure is returned.
pub(crate) fn halt_all(host: &impl ServiceHost, workspace: &str, spec: &WorkspaceSpec) {
    for service in &spec.services {
        let name = companion_name(workspace, &service.name);
        if let Err(e) = host.halt_companion(&name) {
            tracing::warn!(
                workspace,
                service = service.name,
                "stopping the service: {e}"
            );
        }
    }
}

/// Deletes the companions of deleted workspace `workspace`; every one is
/// tried and the first failure, naming its service, returned.
pub(crate) fn delete_all(
    host: &impl ServiceHost,
    workspace: &str,
    spec: &WorkspaceSpec,
) -> Result<()> {
    let mut first = Ok(());
    for service in &spec.services {
        let deleted = host.delete_companion(&companion_name(workspace, &service.name));
        if let (Err(e), Ok(())) = (deleted, &first) {
            first = Err(failed(service)(e));
        }
    }
    first
}

/// What `inspect` shows of workspace `meta`'s services.
pub(crate) fn infos(host: &impl ServiceHost, meta: &Meta) -> Vec<ServiceInfo> {
    meta.spec
        .services
        .iter()
        .enumerate()
        .map(|(i, service)| {
            let companion = companion_name(&meta.name, &service.name);
            let state = host
                .record_of(&companion)
                .map_or_else(|_| "missing".to_owned(), |m| state_word(m.state));
            ServiceInfo {
                name: service.name.clone(),
                image: service.image.clone(),
                ports: service.ports.clone(),
                address: guest_addr(i),
                companion,
                state,
            }
        })
        .collect()
}

fn state_word(state: State) -> String {
    state.to_string()
}

#[cfg(test)]
mod tests;
