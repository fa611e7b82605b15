//! A container of this shim: the workspace it runs in, its init process
//! and its execs. Creating one boots (or joins) its workspace; deleting
//! the one that owns its workspace deletes the workspace too. A container
//! that joins a pod workspace already running has its root filesystem
//! copied into the guest under [`CONTAINERS_DIR`] and its processes run
//! with that as their root.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use containerd_shim::protos::types::mount::Mount;
use workspace::{DeleteOptions, WorkspaceSpec, Workspaces};

use crate::error::ShimError;
use crate::process::{Process, ProcessStatus};
use crate::record::{self, Record};
use crate::spec::{self, ContainerPlan, SandboxRole};
use crate::stdio::Stdio;

/// How long a workspace may take to boot: a cold boot on a host that
/// emulates guest kernel code takes 25-35 s.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// The guest directory that holds, per container id, the root filesystem
/// of each container that joined its pod's running workspace.
pub const CONTAINERS_DIR: &str = "/var/lib/microagent/containers";

/// A container.
#[derive(Debug)]
pub struct Container {
    /// containerd's id.
    pub id: String,
    /// Its bundle directory.
    pub bundle: PathBuf,
    /// The workspace it runs in.
    pub workspace: String,
    /// Whether it owns the workspace (deletes it when deleted).
    pub owns_workspace: bool,
    /// The guest directory that is its root, when it has one of its own;
    /// else it runs in the guest's root (the workspace was booted from its
    /// root filesystem).
    pub root: Option<String>,
    /// Its init process.
    pub init: Arc<Process>,
    execs: Mutex<HashMap<String, Arc<Process>>>,
    /// Its workspace's vCPUs are paused (containerd's Pause).
    pub paused: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What containerd's Create gives.
#[derive(Debug)]
pub struct CreateRequest {
    /// The container id.
    pub id: String,
    /// containerd's namespace.
    pub namespace: String,
    /// The bundle directory.
    pub bundle: PathBuf,
    /// Its root filesystem's mounts.
    pub rootfs: Vec<Mount>,
    /// The init process's FIFOs.
    pub stdio: Stdio,
}

impl Container {
    /// Creates the container: reads its spec, makes (or finds) its image,
    /// and creates and boots its workspace, or joins its pod sandbox's.
    /// Blocking work runs on blocking threads.
    /// `boots` is held while a pod's workspace is looked for and booted,
    /// so two of its containers never boot it twice.
    pub async fn create(
        all: Arc<Workspaces>,
        req: CreateRequest,
        boots: &tokio::sync::Mutex<()>,
    ) -> Result<Arc<Self>, ShimError> {
        let spec = spec::load(&req.bundle)?;
        let plan = spec::plan(&spec, all.limits().max_vcpus)?;
        let mut stdio = req.stdio;
        stdio.terminal = plan.process.terminal;
        let (workspace, owns) = match &plan.placement {
            SandboxRole::Own | SandboxRole::PodSandbox => {
                (record::workspace_name(&req.namespace, &req.id), true)
            }
            SandboxRole::Joins(sandbox) => (record::workspace_name(&req.namespace, sandbox), false),
        };
        record::write(
            &req.bundle,
            &Record {
                workspace: workspace.clone(),
                owns_workspace: owns,
                state_dir: all.state_dir().root().to_owned(),
            },
        )?;
        let booting = boots.lock().await;
        // A pod's sandbox boots nothing unless the pod names its image: the
        // pause image has nothing to run, so the pod's first container
        // boots the pod's workspace from its own root filesystem.
        let boot_now = match &plan.placement {
            SandboxRole::Own => true,
            SandboxRole::PodSandbox => plan.image.is_some(),
            SandboxRole::Joins(_) => !exists(&all, &workspace)?,
        };
        if boot_now {
            let image = match &plan.image {
                Some(image) => image.clone(),
                None => {
                    let (all, bundle, rootfs) =
                        (all.clone(), req.bundle.clone(), req.rootfs.clone());
                    tokio::task::spawn_blocking(move || {
                        crate::rootfs::image_for(&all, &bundle, &rootfs)
                    })
                    .await
                    .map_err(|_| ShimError::WrongState {
                        process: "the root filesystem conversion".into(),
                        why: "was cancelled",
                    })??
                }
            };
            boot(&all, &workspace, &req.namespace, &req.id, image, &plan).await?;
        }
        drop(booting);
        // The pod's workspace runs another root: this container's own is
        // copied in beside it.
        let root = match &plan.placement {
            SandboxRole::Joins(_) if !boot_now => {
                let dir = format!("{}/rootfs", container_dir(&req.id)?);
                let copied = crate::rootfs::copy_into_guest(
                    &all,
                    &workspace,
                    &req.bundle,
                    &req.rootfs,
                    &dir,
                )
                .await?;
                log::info!("container {}: {copied} entries copied to {dir}", req.id);
                Some(dir)
            }
            _ => None,
        };
        let mut process = plan.process;
        process.root = root.clone();
        let init = match plan.placement {
            SandboxRole::PodSandbox => Process::pause(stdio),
            _ => Process::new("", process, stdio),
        };
        Ok(Arc::new(Self {
            id: req.id,
            bundle: req.bundle,
            workspace,
            owns_workspace: owns,
            root,
            init,
            execs: Mutex::new(HashMap::new()),
            paused: AtomicBool::new(false),
        }))
    }

    /// Process `exec_id` ("" for init).
    pub fn process(&self, exec_id: &str) -> Result<Arc<Process>, ShimError> {
        if exec_id.is_empty() {
            return Ok(self.init.clone());
        }
        lock(&self.execs)
            .get(exec_id)
            .cloned()
            .ok_or_else(|| ShimError::NoProcess {
                id: self.id.clone(),
                exec_id: exec_id.to_owned(),
            })
    }

    /// Adds exec `exec_id`, not started.
    pub fn add_exec(&self, process: Arc<Process>) -> Result<(), ShimError> {
        if self.init.status() == ProcessStatus::Stopped {
            return Err(ShimError::WrongState {
                process: format!("container {}", self.id),
                why: "has stopped; execs need it running",
            });
        }
        let mut execs = lock(&self.execs);
        if execs.contains_key(&process.exec_id) {
            return Err(ShimError::Exists(format!("exec {}", process.exec_id)));
        }
        execs.insert(process.exec_id.clone(), process);
        Ok(())
    }

    /// Forgets exec `exec_id`.
    pub fn remove_exec(&self, exec_id: &str) -> Option<Arc<Process>> {
        lock(&self.execs).remove(exec_id)
    }

    /// Every process, init first.
    pub fn processes(&self) -> Vec<Arc<Process>> {
        let mut all = vec![self.init.clone()];
        all.extend(lock(&self.execs).values().cloned());
        all
    }

    /// Ends the workspace when the container owns it (halted, deleted);
    /// its execs end with it. Otherwise only its running execs are killed.
    pub async fn remove(&self, all: &Workspaces) -> Result<(), ShimError> {
        for process in self.processes() {
            if process.status() == ProcessStatus::Running && !self.owns_workspace {
                let _ = process
                    .kill(all, &self.workspace, libc::SIGKILL as u32)
                    .await;
            }
        }
        if self.owns_workspace {
            delete_workspace(all, &self.workspace)?;
        } else if self.root.is_some() {
            self.remove_own_root(all).await;
        }
        let _ = std::fs::remove_file(self.bundle.join(record::RECORD_FILE));
        Ok(())
    }
}

impl Container {
    /// Removes its root filesystem from its pod's guest. A failure is only
    /// logged: the pod's workspace holds it until the pod ends.
    async fn remove_own_root(&self, all: &Workspaces) {
        let Ok(dir) = container_dir(&self.id) else {
            return;
        };
        let removed = match all.workspace(&self.workspace) {
            Ok(ws) => ws.files().remove(&dir, true, false).await.map(drop),
            Err(e) => Err(e),
        };
        match removed {
            Err(e) if e.code() != workspace::ErrorCode::NotFound => log::warn!(
                "container {}: removing {dir} from workspace {}: {}",
                self.id,
                self.workspace,
                workspace::error_chain(&e)
            ),
            _ => {}
        }
    }
}

/// The guest directory of container `id` under [`CONTAINERS_DIR`]
/// (containerd's ids are single path components; anything else is
/// refused).
pub fn container_dir(id: &str) -> Result<String, ShimError> {
    if id.is_empty() || id == "." || id == ".." || id.contains(['/', '\0']) {
        return Err(ShimError::BadSpec(format!(
            "container id {id:?} cannot name a guest directory"
        )));
    }
    Ok(format!("{CONTAINERS_DIR}/{id}"))
}

/// Creates workspace `name` for container `id` and boots it.
async fn boot(
    all: &Workspaces,
    name: &str,
    namespace: &str,
    id: &str,
    image: String,
    plan: &ContainerPlan,
) -> Result<(), ShimError> {
    let mut spec = WorkspaceSpec {
        image,
        vcpus: plan.vcpus,
        mem_mib: plan.mem_mib,
        ..WorkspaceSpec::default()
    };
    spec.labels
        .insert("io.containerd.namespace".into(), namespace.into());
    spec.labels.insert("io.containerd.id".into(), id.into());
    if let Some(network) = &plan.network {
        spec.network = network.clone();
    }
    if let Some(egress) = &plan.egress {
        spec.egress = Some(
            serde_json::from_value(serde_json::Value::String(egress.clone())).map_err(|_| {
                ShimError::BadSpec(format!(
                    "annotation {} is {egress:?}; use all, none or allowlist",
                    spec::EGRESS_ANNOTATION
                ))
            })?,
        );
    }
    all.create(name, spec)
        .map_err(ShimError::workspace(format!("create workspace {name}")))?;
    let started = match all.workspace(name) {
        Ok(ws) => ws.start(BOOT_TIMEOUT, |_| {}).await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = started {
        // Nothing half made stays behind a failed create.
        let _ = delete_workspace(all, name);
        return Err(ShimError::workspace(format!("start workspace {name}"))(e));
    }
    Ok(())
}

/// Whether workspace `name` exists.
fn exists(all: &Workspaces, name: &str) -> Result<bool, ShimError> {
    match all.workspace(name).and_then(|ws| ws.get()) {
        Ok(_) => Ok(true),
        Err(e) if e.code() == workspace::ErrorCode::NotFound => Ok(false),
        Err(e) => Err(ShimError::workspace(format!("look for workspace {name}"))(
            e,
        )),
    }
}

/// Halts and deletes workspace `name`; one already gone is fine.
pub fn delete_workspace(all: &Workspaces, name: &str) -> Result<(), ShimError> {
    let deleted = all
        .workspace(name)
        .and_then(|ws| ws.delete(DeleteOptions::default().force(true)));
    match deleted {
        Ok(_) => Ok(()),
        Err(e) if e.code() == workspace::ErrorCode::NotFound => Ok(()),
        Err(e) => Err(ShimError::workspace(format!("delete workspace {name}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_dir_is_one_component_under_the_containers_dir() {
        assert_eq!(
            container_dir("web-1.a_b").unwrap(),
            format!("{CONTAINERS_DIR}/web-1.a_b")
        );
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert!(
                matches!(container_dir(bad), Err(ShimError::BadSpec(_))),
                "{bad:?}"
            );
        }
    }
}
