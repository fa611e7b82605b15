//! The collection as a workspace's services use it ([`ServiceHost`]):
//! here, above the start a companion's start drives and the guest its
//! command and the workspace's forwards reach.

use crate::error::{Error, Result};
use std::path::Path;
use std::time::Duration;

use crate::guest::processes::{ProcessOptions, ProcessOutput};
use crate::guest::request::ExecRequest;
use crate::services::{CompanionStart, ServiceHost, ServiceSnapshot, SERVICE_PROCESS};
use crate::workspaces::handle::Workspace;
use crate::workspaces::lifecycle::DEFAULT_START_TIMEOUT;
use crate::workspaces::manager::Workspaces;
use base::code::ErrorCode;
use base::images::oci::config::ImageDefaults;
use base::store::spec::services::{companion_name, SERVICE_NAMESPACE};
use base::store::spec::{DeleteOptions, Meta, Owner, WorkspaceSpec};
use base::store::state::State;
use base::vmm::control::ControlRequest;
use guest_agent::protocol::Forward;

impl ServiceHost for Workspaces {
    fn create_companion(&self, name: &str, spec: WorkspaceSpec) -> Result<()> {
        self.reserved_view(SERVICE_NAMESPACE)
            .create(name, spec)
            .map(drop)
    }

    fn record_of(&self, name: &str) -> Result<Meta> {
        self.reserved_view(SERVICE_NAMESPACE).at(name).get_here()
    }

    fn service_defaults(&self, image: &str) -> ImageDefaults {
        self.image_defaults(image)
    }

    fn halt_companion(&self, name: &str) -> Result<()> {
        match self.reserved_view(SERVICE_NAMESPACE).at(name).halt() {
            Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
            other => other.map(drop),
        }
    }

    fn halt_served(&self, name: &str) -> Result<()> {
        self.at(name).halt().map(drop)
    }

    fn delete_companion(&self, name: &str) -> Result<()> {
        let deleted = self
            .reserved_view(SERVICE_NAMESPACE)
            .at(name)
            .delete(DeleteOptions::default().force(true));
        match deleted {
            Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
            other => other.map(drop),
        }
    }

    async fn start_companion(
        &self,
        name: &str,
        owner: Option<Owner>,
        how: CompanionStart,
    ) -> Result<()> {
        let view = self.reserved_view(SERVICE_NAMESPACE);
        {
            // Stopped here (its workspace was): the next VMM reads it.
            let (_lock, mut meta) = view.lock_existing(name)?;
            meta.spec.owner = owner;
            view.dir(name)?.write_meta(&meta)?;
        }
        let command = match how {
            // Its command runs on in the memory it resumes.
            CompanionStart::Resume(part) => {
                return view
                    .start_machine(name, DEFAULT_START_TIMEOUT, |_| {}, Some(&part))
                    .await
                    .map(drop);
            }
            CompanionStart::Run(command) => command,
        };
        // Not `Workspace::start`, which starts a workspace's services: a
        // companion has none (and no repository).
        view.snapshots()
            .start_maybe_warm(name, DEFAULT_START_TIMEOUT, |_| {}, false)
            .await?;
        let options = ProcessOptions {
            id: Some(SERVICE_PROCESS.to_owned()),
            ..ProcessOptions::default()
        };
        view.at(name)
            .processes()
            .process_start(ExecRequest::argv(command), options)
            .await
            .map(drop)
    }

    fn pause_companion(&self, name: &str, pause: bool) -> Result<bool> {
        let view = self.reserved_view(SERVICE_NAMESPACE);
        match view.at(name).get_here() {
            Ok(meta) if meta.state == State::Running => {}
            Ok(_) => return Ok(false),
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(false),
            Err(e) => return Err(e),
        }
        let request = if pause {
            ControlRequest::Pause
        } else {
            ControlRequest::Resume
        };
        view.pause_or_resume(name, request).map(|()| true)
    }

    fn snapshot_companion(
        &self,
        name: &str,
        service: &str,
        into: &Path,
    ) -> Result<ServiceSnapshot> {
        self.reserved_view(SERVICE_NAMESPACE)
            .snapshots()
            .write_part(name, service, into)
    }

    fn load_companion_disk(&self, name: &str, part: &Path) -> Result<()> {
        self.halt_companion(name)?;
        let view = self.reserved_view(SERVICE_NAMESPACE);
        let (_lock, meta) = view.lock_existing(name)?;
        if meta.state.has_vmm() {
            return Err(Error::WrongState {
                name: name.to_owned(),
                state: meta.state,
                why: "its disk is put back from a snapshot only while it is stopped",
                remedy: None,
            });
        }
        crate::snapshots::copy_snapshot_disk(part, &view.dir(name)?)
    }

    async fn give_forwards(&self, name: &str, forwards: Vec<Forward>) -> Result<()> {
        self.at(name)
            .agent()
            .await?
            .forward(forwards)
            .await
            .map_err(Error::agent("forward"))
    }
}

impl Workspace<'_> {
    /// The output of service `service`'s command (its companion's
    /// background process [`SERVICE_PROCESS`]) from `cursors`, as
    /// [`crate::guest::processes::WorkspaceProcesses::process_output`]
    /// reads it; NOT_FOUND when the workspace names no such service.
    pub async fn service_output(
        self,
        service: &str,
        cursors: [u64; 2],
        wait: Duration,
    ) -> Result<ProcessOutput> {
        let meta = self.get_here()?;
        if !meta.spec.services.iter().any(|s| s.name == service) {
            return Err(Error::ServiceNotFound {
                workspace: self.name().to_owned(),
                service: service.to_owned(),
            });
        }
        let view = self.all.reserved_view(SERVICE_NAMESPACE);
        // The handle's name: the record is written by the workspace's VMM.
        let companion = companion_name(self.name(), service);
        view.at(&companion)
            .processes()
            .process_output(SERVICE_PROCESS, cursors, None, wait)
            .await
            .map_err(crate::services::failed(service))
    }
}
