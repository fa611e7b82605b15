//! The task service containerd calls: each call parses its request, makes
//! one call on the container or process it names, publishes the event
//! containerd expects, and answers.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use async_trait::async_trait;
use containerd_shim::api;
use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::protos::events::task::{
    TaskCheckpointed, TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim::protos::protobuf::MessageDyn;
use containerd_shim::protos::shim_async::Task;
use containerd_shim::protos::topics;
use containerd_shim::protos::ttrpc::r#async::TtrpcContext;
use containerd_shim::{Context, TtrpcResult};
use workspace::Workspaces;

use crate::container::{Container, CreateRequest};
use crate::error::ShimError;
use crate::process::{Exit, Process, ProcessStatus};
use crate::spec::ProcessPlan;
use crate::stdio::Stdio;

/// The shim's task service: the containers it runs.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

struct Inner {
    /// The state directory's workspaces, or why it could not be opened.
    all: Result<Arc<Workspaces>, String>,
    namespace: String,
    containers: Mutex<HashMap<String, Arc<Container>>>,
    /// Held while a container's workspace is booted (a pod's containers
    /// come one at a time to it).
    boots: tokio::sync::Mutex<()>,
    publisher: Option<RemotePublisher>,
    exit: Arc<ExitSignal>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn timestamp(at: SystemTime) -> Timestamp {
    let since = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let mut ts = Timestamp::new();
    ts.seconds = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    ts.nanos = i32::try_from(since.subsec_nanos()).unwrap_or(0);
    ts
}

impl Service {
    /// A service for containerd namespace `namespace`.
    pub fn new(
        all: Result<Arc<Workspaces>, String>,
        namespace: &str,
        publisher: Option<RemotePublisher>,
        exit: Arc<ExitSignal>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                all,
                namespace: namespace.to_owned(),
                containers: Mutex::new(HashMap::new()),
                boots: tokio::sync::Mutex::new(()),
                publisher,
                exit,
            }),
        }
    }

    fn all(&self) -> Result<Arc<Workspaces>, ShimError> {
        self.inner.all.clone().map_err(ShimError::StateDir)
    }

    fn container(&self, id: &str) -> Result<Arc<Container>, ShimError> {
        lock(&self.inner.containers)
            .get(id)
            .cloned()
            .ok_or_else(|| ShimError::NoContainer(id.to_owned()))
    }

    async fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        if let Some(publisher) = &self.inner.publisher {
            let ctx = Context::default();
            if let Err(e) = publisher
                .publish(ctx, topic, &self.inner.namespace, event)
                .await
            {
                log::warn!("publishing {topic}: {e}");
            }
        }
    }

    /// Publishes the process's exit once it comes; the init's end also
    /// ends the container's execs, as a container's pid namespace would.
    fn watch_exit(&self, container: Arc<Container>, process: Arc<Process>) {
        let me = self.clone();
        tokio::spawn(async move {
            let exit = process.wait().await;
            if process.exec_id.is_empty() {
                if let Ok(all) = me.all() {
                    for exec in container.processes().into_iter().skip(1) {
                        if exec.status() == ProcessStatus::Running {
                            let _ = exec
                                .kill(&all, &container.workspace, libc::SIGKILL as u32)
                                .await;
                        }
                    }
                }
            }
            let event = TaskExit {
                container_id: container.id.clone(),
                id: if process.exec_id.is_empty() {
                    container.id.clone()
                } else {
                    process.exec_id.clone()
                },
                pid: process.pid(),
                exit_status: exit.status,
                exited_at: Some(timestamp(exit.at)).into(),
                ..TaskExit::default()
            };
            me.publish(topics::TASK_EXIT_EVENT_TOPIC, Box::new(event))
                .await;
        });
    }

    /// Whether no container is left (the shim may exit).
    pub fn is_empty(&self) -> bool {
        lock(&self.inner.containers).is_empty()
    }

    async fn do_create(
        &self,
        req: api::CreateTaskRequest,
    ) -> Result<api::CreateTaskResponse, ShimError> {
        if !req.checkpoint.is_empty() {
            return Err(ShimError::Unsupported {
                call: "creating from a checkpoint",
                why: "restore a workspace snapshot with `microagent fork` instead",
            });
        }
        if lock(&self.inner.containers).contains_key(&req.id) {
            return Err(ShimError::Exists(format!("container {}", req.id)));
        }
        let container = Container::create(
            self.all()?,
            CreateRequest {
                id: req.id.clone(),
                namespace: self.inner.namespace.clone(),
                bundle: req.bundle.clone().into(),
                rootfs: req.rootfs.clone(),
                stdio: Stdio {
                    stdin: req.stdin.clone(),
                    stdout: req.stdout.clone(),
                    stderr: req.stderr.clone(),
                    terminal: req.terminal,
                },
            },
            &self.inner.boots,
        )
        .await?;
        lock(&self.inner.containers).insert(req.id.clone(), container.clone());
        self.publish(
            topics::TASK_CREATE_EVENT_TOPIC,
            Box::new(TaskCreate {
                container_id: req.id.clone(),
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                pid: std::process::id(),
                ..TaskCreate::default()
            }),
        )
        .await;
        Ok(api::CreateTaskResponse {
            pid: std::process::id(),
            ..Default::default()
        })
    }

    async fn do_start(&self, req: api::StartRequest) -> Result<api::StartResponse, ShimError> {
        let container = self.container(&req.id)?;
        let process = container.process(&req.exec_id)?;
        let pid = process
            .start(self.all()?, container.workspace.clone())
            .await?;
        self.watch_exit(container.clone(), process);
        if req.exec_id.is_empty() {
            self.publish(
                topics::TASK_START_EVENT_TOPIC,
                Box::new(TaskStart {
                    container_id: req.id.clone(),
                    pid,
                    ..TaskStart::default()
                }),
            )
            .await;
        } else {
            self.publish(
                topics::TASK_EXEC_STARTED_EVENT_TOPIC,
                Box::new(TaskExecStarted {
                    container_id: req.id.clone(),
                    exec_id: req.exec_id.clone(),
                    pid,
                    ..TaskExecStarted::default()
                }),
            )
            .await;
        }
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }

    fn do_state(&self, req: &api::StateRequest) -> Result<api::StateResponse, ShimError> {
        let container = self.container(&req.id)?;
        let process = container.process(&req.exec_id)?;
        let status = match process.status() {
            ProcessStatus::Created => api::Status::CREATED,
            ProcessStatus::Running if container.paused.load(Ordering::SeqCst) => {
                api::Status::PAUSED
            }
            ProcessStatus::Running => api::Status::RUNNING,
            ProcessStatus::Stopped => api::Status::STOPPED,
        };
        let exit = process.exit();
        Ok(api::StateResponse {
            id: req.id.clone(),
            bundle: container.bundle.display().to_string(),
            pid: process.pid(),
            status: status.into(),
            stdin: process.stdio.stdin.clone(),
            stdout: process.stdio.stdout.clone(),
            stderr: process.stdio.stderr.clone(),
            terminal: process.stdio.terminal,
            exit_status: exit.map_or(0, |e| e.status),
            exited_at: exit.map(|e| timestamp(e.at)).into(),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        })
    }

    async fn do_delete(&self, req: api::DeleteRequest) -> Result<api::DeleteResponse, ShimError> {
        let container = self.container(&req.id)?;
        let process = container.process(&req.exec_id)?;
        if process.status() == ProcessStatus::Running {
            return Err(ShimError::WrongState {
                process: format!("{} of container {}", describe(&req.exec_id), req.id),
                why: "is still running; kill it first",
            });
        }
        let exit = process.exit().unwrap_or(Exit {
            status: 0,
            at: SystemTime::now(),
        });
        if req.exec_id.is_empty() {
            container.remove(&*self.all()?).await?;
            lock(&self.inner.containers).remove(&req.id);
            self.publish(
                topics::TASK_DELETE_EVENT_TOPIC,
                Box::new(TaskDelete {
                    container_id: req.id.clone(),
                    pid: process.pid(),
                    exit_status: exit.status,
                    exited_at: Some(timestamp(exit.at)).into(),
                    id: req.id.clone(),
                    ..TaskDelete::default()
                }),
            )
            .await;
        } else {
            container.remove_exec(&req.exec_id);
        }
        Ok(api::DeleteResponse {
            pid: process.pid(),
            exit_status: exit.status,
            exited_at: Some(timestamp(exit.at)).into(),
            ..Default::default()
        })
    }

    async fn do_exec(&self, req: api::ExecProcessRequest) -> Result<(), ShimError> {
        let container = self.container(&req.id)?;
        let spec = req
            .spec
            .as_ref()
            .ok_or_else(|| ShimError::BadSpec("the exec has no process spec".into()))?;
        let mut plan = ProcessPlan::from_json(&spec.value)?;
        // An exec runs in its container's root filesystem.
        plan.root = container.root.clone();
        let stdio = Stdio {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal || plan.terminal,
        };
        container.add_exec(Process::new(&req.exec_id, plan, stdio))?;
        self.publish(
            topics::TASK_EXEC_ADDED_EVENT_TOPIC,
            Box::new(TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..TaskExecAdded::default()
            }),
        )
        .await;
        Ok(())
    }

    async fn do_kill(&self, req: api::KillRequest) -> Result<(), ShimError> {
        let container = self.container(&req.id)?;
        let all = self.all()?;
        if req.all {
            for process in container.processes() {
                if process.status() != ProcessStatus::Stopped {
                    let _ = process.kill(&all, &container.workspace, req.signal).await;
                }
            }
            return Ok(());
        }
        container
            .process(&req.exec_id)?
            .kill(&all, &container.workspace, req.signal)
            .await
    }

    async fn do_stats(&self, req: api::StatsRequest) -> Result<api::StatsResponse, ShimError> {
        let container = self.container(&req.id)?;
        let all = self.all()?;
        let what = format!("read the metrics of workspace {}", container.workspace);
        let metrics = all
            .metrics()
            .figures(Some(&container.workspace))
            .await
            .map_err(ShimError::workspace(what.clone()))?;
        let m = metrics
            .first()
            .ok_or_else(|| ShimError::NoContainer(req.id.clone()))?;
        let cpu = all
            .workspace(&container.workspace)
            .and_then(|ws| ws.get())
            .ok()
            .and_then(|meta| meta.runtime)
            .and_then(|rt| crate::stats::process_cpu_ns(rt.pid));
        let any = containerd_shim::util::convert_to_any(Box::new(crate::stats::metrics(m, cpu)))
            .map_err(|e| ShimError::Protobuf("the metrics", e))?;
        Ok(api::StatsResponse {
            stats: Some(any).into(),
            ..Default::default()
        })
    }
}

impl Service {
    /// Pauses (or resumes) the vCPUs of container `id`'s workspace; a
    /// pod's containers share theirs.
    async fn pause_or_resume(&self, id: &str, pause: bool) -> Result<(), ShimError> {
        let container = self.container(id)?;
        let all = self.all()?;
        let name = container.workspace.clone();
        let what = format!(
            "{} workspace {name}",
            if pause { "pause" } else { "resume" }
        );
        // A resume may restore a hibernated workspace: async.
        tokio::task::spawn(async move {
            if pause {
                tokio::task::spawn_blocking(move || all.workspace(&name)?.pause())
                    .await
                    .map_err(|e| workspace::Error::BlockingStep(e.to_string()))?
            } else {
                all.workspace(&name)?.resume().await
            }
        })
        .await
        .map_err(|_| ShimError::WrongState {
            process: what.clone(),
            why: "was cancelled",
        })?
        .map_err(ShimError::workspace(what))?;
        container.paused.store(pause, Ordering::SeqCst);
        let (topic, event): (&str, Box<dyn MessageDyn>) = if pause {
            (
                topics::TASK_PAUSED_EVENT_TOPIC,
                Box::new(TaskPaused {
                    container_id: id.to_owned(),
                    ..TaskPaused::default()
                }),
            )
        } else {
            (
                topics::TASK_RESUMED_EVENT_TOPIC,
                Box::new(TaskResumed {
                    container_id: id.to_owned(),
                    ..TaskResumed::default()
                }),
            )
        };
        self.publish(topic, event).await;
        Ok(())
    }
}

fn describe(exec_id: &str) -> String {
    match exec_id {
        "" => "the init process".into(),
        id => format!("exec {id}"),
    }
}

#[async_trait]
impl Task for Service {
    async fn state(
        &self,
        _: &TtrpcContext,
        req: api::StateRequest,
    ) -> TtrpcResult<api::StateResponse> {
        Ok(self.do_state(&req)?)
    }

    async fn create(
        &self,
        _: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> TtrpcResult<api::CreateTaskResponse> {
        Ok(self.do_create(req).await?)
    }

    async fn start(
        &self,
        _: &TtrpcContext,
        req: api::StartRequest,
    ) -> TtrpcResult<api::StartResponse> {
        Ok(self.do_start(req).await?)
    }

    async fn delete(
        &self,
        _: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> TtrpcResult<api::DeleteResponse> {
        Ok(self.do_delete(req).await?)
    }

    async fn pids(
        &self,
        _: &TtrpcContext,
        req: api::PidsRequest,
    ) -> TtrpcResult<api::PidsResponse> {
        let container = self.container(&req.id)?;
        let processes = container
            .processes()
            .into_iter()
            .filter(|p| p.status() == ProcessStatus::Running)
            .map(|p| containerd_shim::protos::types::task::ProcessInfo {
                pid: p.pid(),
                ..Default::default()
            })
            .collect();
        Ok(api::PidsResponse {
            processes,
            ..Default::default()
        })
    }

    async fn kill(&self, _: &TtrpcContext, req: api::KillRequest) -> TtrpcResult<api::Empty> {
        self.do_kill(req).await?;
        Ok(api::Empty::default())
    }

    async fn exec(
        &self,
        _: &TtrpcContext,
        req: api::ExecProcessRequest,
    ) -> TtrpcResult<api::Empty> {
        self.do_exec(req).await?;
        Ok(api::Empty::default())
    }

    async fn resize_pty(
        &self,
        _: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> TtrpcResult<api::Empty> {
        let process = self.container(&req.id)?.process(&req.exec_id)?;
        let rows = u16::try_from(req.height).unwrap_or(u16::MAX);
        let cols = u16::try_from(req.width).unwrap_or(u16::MAX);
        process.resize(rows, cols).await?;
        Ok(api::Empty::default())
    }

    async fn close_io(
        &self,
        _: &TtrpcContext,
        req: api::CloseIORequest,
    ) -> TtrpcResult<api::Empty> {
        let process = self.container(&req.id)?.process(&req.exec_id)?;
        if req.stdin {
            process.close_stdin();
        }
        Ok(api::Empty::default())
    }

    async fn wait(
        &self,
        _: &TtrpcContext,
        req: api::WaitRequest,
    ) -> TtrpcResult<api::WaitResponse> {
        let process = self.container(&req.id)?.process(&req.exec_id)?;
        let exit = process.wait().await;
        Ok(api::WaitResponse {
            exit_status: exit.status,
            exited_at: Some(timestamp(exit.at)).into(),
            ..Default::default()
        })
    }

    async fn stats(
        &self,
        _: &TtrpcContext,
        req: api::StatsRequest,
    ) -> TtrpcResult<api::StatsResponse> {
        Ok(self.do_stats(req).await?)
    }

    async fn connect(
        &self,
        _: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> TtrpcResult<api::ConnectResponse> {
        let task_pid = self.container(&req.id).map_or(0, |c| c.init.pid());
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        })
    }

    async fn shutdown(
        &self,
        _: &TtrpcContext,
        req: api::ShutdownRequest,
    ) -> TtrpcResult<api::Empty> {
        // A shim serving a pod stays while any of its containers does.
        if req.now || self.is_empty() {
            self.inner.exit.signal();
        }
        Ok(api::Empty::default())
    }

    async fn pause(&self, _: &TtrpcContext, req: api::PauseRequest) -> TtrpcResult<api::Empty> {
        self.pause_or_resume(&req.id, true).await?;
        Ok(api::Empty::default())
    }

    async fn resume(&self, _: &TtrpcContext, req: api::ResumeRequest) -> TtrpcResult<api::Empty> {
        self.pause_or_resume(&req.id, false).await?;
        Ok(api::Empty::default())
    }

    async fn checkpoint(
        &self,
        _: &TtrpcContext,
        req: api::CheckpointTaskRequest,
    ) -> TtrpcResult<api::Empty> {
        let container = self.container(&req.id)?;
        let snapshot =
            crate::checkpoint::take(self.all()?, &container.workspace, Path::new(&req.path))
                .await?;
        self.publish(
            topics::TASK_CHECKPOINTED_EVENT_TOPIC,
            Box::new(TaskCheckpointed {
                container_id: req.id.clone(),
                checkpoint: snapshot,
                ..TaskCheckpointed::default()
            }),
        )
        .await;
        Ok(api::Empty::default())
    }

    async fn update(&self, _: &TtrpcContext, _: api::UpdateTaskRequest) -> TtrpcResult<api::Empty> {
        Err(ShimError::Unsupported {
            call: "update",
            why: "a workspace's vCPUs and memory are fixed when it is created",
        }
        .into())
    }
}
