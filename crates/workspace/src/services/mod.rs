//! A workspace's services (`base::store::spec::services`): each a companion
//! workspace in the reserved namespace, created, started, stopped and
//! deleted with its workspace, its command a background process
//! [`SERVICE_PROCESS`], and reached from the workspace's guest by name once
//! the workspace's agent has its forwards. The collection sits above this
//! folder (its create, start, stop and delete drive it), so these calls
//! reach it through [`ServiceHost`], which it implements
//! (`snapshots/service_host.rs`, above the start and the guest).

use std::future::Future;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use base::code::ErrorCode;
use base::images::oci::config::ImageDefaults;
use base::store::spec::services::{companion_name, guest_addr, routes, ServiceSpec, Serving};
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

    /// Stops workspace `name` (a full name) at once: its services failed.
    fn halt_served(&self, name: &str) -> Result<()>;

    /// Deletes companion `name`, halted first; one that is gone is fine.
    fn delete_companion(&self, name: &str) -> Result<()>;

    /// Starts companion `name` for the process `owner` (its VMM ends with
    /// it) as `how` says.
    fn start_companion(
        &self,
        name: &str,
        owner: Option<Owner>,
        how: CompanionStart,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Pauses (`pause`) or resumes companion `name`'s vCPUs; false when it
    /// does not run (nothing to pause).
    fn pause_companion(&self, name: &str, pause: bool) -> Result<bool>;

    /// Writes companion `name`'s machine into the new directory `into`
    /// (memory and disk when it runs, its disk when stopped) as service
    /// `service`'s part of a snapshot, with its digests; NOT_FOUND when it
    /// is gone.
    fn snapshot_companion(&self, name: &str, service: &str, into: &Path)
        -> Result<ServiceSnapshot>;

    /// Makes companion `name`'s disk a copy of the one in the snapshot
    /// part `part`, halting it first.
    fn load_companion_disk(&self, name: &str, part: &Path) -> Result<()>;

    /// Gives running workspace `name`'s guest `forwards`, replacing its
    /// own.
    fn give_forwards(
        &self,
        name: &str,
        forwards: Vec<Forward>,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// How a companion starts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CompanionStart {
    /// Booted, then its service's command run as [`SERVICE_PROCESS`].
    Run(Vec<String>),
    /// Resumed from the snapshot part in this directory, its command still
    /// running there.
    Resume(PathBuf),
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

/// A failure of service `service`, named.
pub(crate) fn failed(service: &str) -> impl FnOnce(Error) -> Error + '_ {
    move |e| Error::Service {
        service: service.to_owned(),
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
                "image `{}` names no command; give the service one",
                service.image
            ))
        })
}

/// Creates the companion of service `index` of workspace `workspace`
/// (its spec `spec`); the caller names the service in a failure.
fn create_one(
    host: &impl ServiceHost,
    workspace: &str,
    spec: &WorkspaceSpec,
    index: usize,
) -> Result<String> {
    let service = &spec.services[index];
    let name = companion_name(workspace, &service.name);
    let sized = host.service_defaults(&service.image);
    command_of(host, service)?;
    host.create_companion(&name, companion_spec(workspace, spec, index, &sized))?;
    Ok(name)
}

/// Companion `index` of workspace `workspace`, made when it is missing (a
/// fork's, a restore's, or a create cut short); the caller names the
/// service in a failure.
fn ensure_companion(
    host: &impl ServiceHost,
    workspace: &str,
    spec: &WorkspaceSpec,
    index: usize,
) -> Result<String> {
    let name = companion_name(workspace, &spec.services[index].name);
    match host.record_of(&name) {
        Err(e) if e.code() == ErrorCode::NotFound => create_one(host, workspace, spec, index),
        Err(e) => Err(e),
        Ok(_) => Ok(name),
    }
}

/// Creates the companions of new workspace `workspace` (its spec `spec`),
/// stopping at the first failure, which names the service. The caller
/// then deletes the workspace, whose delete removes those made.
pub(crate) fn create_all(
    host: &impl ServiceHost,
    workspace: &str,
    spec: &WorkspaceSpec,
) -> Result<()> {
    spec.services
        .iter()
        .enumerate()
        .try_for_each(|(i, service)| {
            create_one(host, workspace, spec, i)
                .map(drop)
                .map_err(failed(&service.name))
        })
}

/// Starts the services of running workspace `workspace` (by the name its
/// handle holds, never its record's: a VMM may write that record), whose
/// record is `meta`, each owned by the workspace's VMM, then gives its
/// guest their names. With `from` (a restore's or a fork's snapshot), each
/// service that has a part there starts from it. A
/// companion that is missing is made first. A service that fails stops the
/// others and the workspace; the failure names it.
pub(crate) async fn start_all(
    host: &impl ServiceHost,
    workspace: &str,
    meta: &Meta,
    from: Option<ServiceOrigin<'_>>,
) -> Result<()> {
    let spec = &meta.spec;
    if spec.services.is_empty() {
        return Ok(());
    }
    let started = start_each(host, workspace, meta, from).await;
    if started.is_err() {
        halt_all(host, workspace, spec);
        if let Err(e) = host.halt_served(workspace) {
            tracing::warn!(workspace, "stopping the workspace its services failed: {e}");
        }
    }
    started
}

async fn start_each(
    host: &impl ServiceHost,
    workspace: &str,
    meta: &Meta,
    from: Option<ServiceOrigin<'_>>,
) -> Result<()> {
    let spec = &meta.spec;
    let owner = meta.runtime.as_ref().and_then(|r| {
        base::store::process::start_ticks(r.pid).map(|start_ticks| Owner {
            pid: r.pid,
            start_ticks,
        })
    });
    // All at once: each boot is slow here, and they wait on nothing of
    // each other's.
    let starts = spec
        .services
        .iter()
        .enumerate()
        .map(|(i, service)| async move {
            let started = async {
                let name = ensure_companion(host, workspace, spec, i)?;
                let how = snapshot::how_to_start(host, &name, spec, i, from)?;
                host.start_companion(&name, owner, how).await
            };
            started.await.map_err(failed(&service.name))
        });
    futures_util::future::try_join_all(starts).await?;
    let forwards = routes(&spec.services)
        .map(|(i, service, port, vsock_port)| Forward {
            name: service.name.clone(),
            addr: guest_addr(i),
            port,
            vsock_port,
        })
        .collect();
    host.give_forwards(workspace, forwards).await
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
            first = Err(failed(&service.name)(e));
        }
    }
    first
}

/// What `inspect` shows of the services of workspace `workspace` (by its
/// handle's name), whose spec is `spec`.
pub(crate) fn infos(
    host: &impl ServiceHost,
    workspace: &str,
    spec: &WorkspaceSpec,
) -> Vec<ServiceInfo> {
    spec.services
        .iter()
        .enumerate()
        .map(|(i, service)| {
            let companion = companion_name(workspace, &service.name);
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

mod snapshot;
pub use snapshot::ServiceSnapshot;
pub(crate) use snapshot::{move_parts, restore_disks, snapshot_all, ServiceOrigin};

#[cfg(test)]
mod tests;
