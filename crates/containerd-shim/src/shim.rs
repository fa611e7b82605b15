//! The shim's life: `start` (spawn the serving shim, one per pod sandbox,
//! and print its address), `delete` (clean up after a container whose
//! shim died), and serving until containerd shuts it down.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::api::DeleteResponse;
use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::asynchronous::{spawn, ExitSignal, Shim};
use containerd_shim::{Config, Error, Flags, StartOpts};
use workspace::Workspaces;

use crate::container::delete_workspace;
use crate::record;
use crate::service::Service;

/// The program the workspaces' VMMs run: `microagent-vmm`, installed
/// beside this shim.
const VMM_PROGRAM: &str = "microagent-vmm";

/// Exit status a container whose shim died is given (SIGKILL's).
const KILLED_EXIT: u32 = 128 + 9;

/// The shim process.
pub struct MicroagentShim {
    namespace: String,
    bundle: PathBuf,
    exit: Arc<ExitSignal>,
}

/// Opens the state directory (`MICROAGENT_HOME`, else the default), its
/// VMMs run by `microagent-vmm` beside this program.
pub fn open_workspaces(state_dir: Option<&Path>) -> Result<Workspaces, workspace::Error> {
    let mut builder = Workspaces::builder();
    if let Some(dir) = state_dir {
        builder = builder.state_dir(dir);
    }
    if let Ok(me) = std::env::current_exe() {
        builder = builder
            .vmm_program(me.with_file_name(VMM_PROGRAM))
            .standby_vmms(true);
    }
    builder.build()
}

#[async_trait]
impl Shim for MicroagentShim {
    type T = Service;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        let bundle = if args.bundle.is_empty() {
            std::env::current_dir().unwrap_or_default()
        } else {
            PathBuf::from(&args.bundle)
        };
        Self {
            namespace: args.namespace.clone(),
            bundle,
            exit: Arc::new(ExitSignal::default()),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> Result<String, Error> {
        // One shim serves a pod: its containers share its workspace.
        let grouping = crate::spec::load(&self.bundle)
            .map(|spec| crate::spec::grouping(&spec, &opts.id))
            .unwrap_or_else(|_| opts.id.clone());
        let address = spawn(opts, &grouping, Vec::new()).await?;
        containerd_shim::asynchronous::util::write_str_to_file(
            self.bundle.join("address"),
            &address,
        )
        .await?;
        Ok(address)
    }

    async fn delete_shim(&mut self) -> Result<DeleteResponse, Error> {
        // The shim that served this container died: what it started is
        // stopped and removed here.
        match record::read(&self.bundle) {
            Ok(Some(record)) => {
                if record.owns_workspace {
                    let deleted = open_workspaces(Some(&record.state_dir))
                        .map_err(|e| Error::Other(workspace::error_chain(&e)))
                        .and_then(|all| {
                            delete_workspace(&all, &record.workspace)
                                .map_err(|e| Error::Other(workspace::error_chain(&e)))
                        });
                    if let Err(e) = deleted {
                        log::warn!("cleaning up after a dead shim: {e}");
                    }
                }
                let _ = std::fs::remove_file(self.bundle.join(record::RECORD_FILE));
            }
            Ok(None) => {}
            Err(e) => log::warn!("{}", workspace::error_chain(&e)),
        }
        let _ = crate::rootfs::unmount(&self.bundle.join("rootfs"));
        let mut response = DeleteResponse::new();
        response.exit_status = KILLED_EXIT;
        response.exited_at = Some(containerd_shim::util::timestamp()?).into();
        Ok(response)
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        let all = open_workspaces(None)
            .map(Arc::new)
            .map_err(|e| workspace::error_chain(&e));
        Service::new(all, &self.namespace, Some(publisher), self.exit.clone())
    }
}
