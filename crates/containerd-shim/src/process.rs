//! One process of a container (its init, or an exec) run in the guest by
//! the agent as a streaming command: created, started with its stdio
//! bridged, signalled, waited for. Its exit status is what runc's would
//! be: the exit code, or 128 + the signal that killed it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use tokio::sync::{oneshot, watch};
use workspace::guest::ExecEvent;
use workspace::Workspaces;

use crate::error::ShimError;
use crate::spec::ProcessPlan;
use crate::stdio::{self, InputControl, OutputFifos, Stdio};

/// Exit status when the process's end could not be learned (the guest or
/// its agent went away), as containerd reports for a shim that died.
pub const UNKNOWN_EXIT: u32 = 255;

/// Where a process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessStatus {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Ended.
    Stopped,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Exit code, or 128 + signal.
    pub status: u32,
    /// When.
    pub at: SystemTime,
}

#[derive(Debug)]
struct Inner {
    status: ProcessStatus,
    /// The guest's pid once started.
    pid: u32,
    /// The agent's id for it once started (what signals name).
    guest_exec_id: Option<String>,
}

/// A process of a container.
#[derive(Debug)]
pub struct Process {
    /// containerd's exec id (empty for the init process).
    pub exec_id: String,
    /// Its FIFOs.
    pub stdio: Stdio,
    /// What the agent runs; None for a pod's pause process, which runs
    /// nowhere (it only holds the pod's namespaces under runc).
    plan: Option<ProcessPlan>,
    inner: Mutex<Inner>,
    exit: watch::Sender<Option<Exit>>,
    input: Mutex<Option<InputControl>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Process {
    /// A process not yet started.
    pub fn new(exec_id: &str, plan: ProcessPlan, stdio: Stdio) -> Arc<Self> {
        Self::with_plan(exec_id, Some(plan), stdio)
    }

    /// A pod sandbox's pause process: started and killed like any other,
    /// run nowhere.
    pub fn pause(stdio: Stdio) -> Arc<Self> {
        Self::with_plan("", None, stdio)
    }

    fn with_plan(exec_id: &str, plan: Option<ProcessPlan>, stdio: Stdio) -> Arc<Self> {
        Arc::new(Self {
            exec_id: exec_id.to_owned(),
            stdio,
            plan,
            inner: Mutex::new(Inner {
                status: ProcessStatus::Created,
                pid: 0,
                guest_exec_id: None,
            }),
            exit: watch::channel(None).0,
            input: Mutex::new(None),
        })
    }

    /// Its status.
    pub fn status(&self) -> ProcessStatus {
        lock(&self.inner).status
    }

    /// Its guest pid (0 before it starts).
    pub fn pid(&self) -> u32 {
        lock(&self.inner).pid
    }

    /// How it ended, once it has.
    pub fn exit(&self) -> Option<Exit> {
        *self.exit.borrow()
    }

    /// Starts it in workspace `workspace` and returns its guest pid once
    /// the agent has spawned it.
    pub async fn start(
        self: &Arc<Self>,
        all: Arc<Workspaces>,
        workspace: String,
    ) -> Result<u32, ShimError> {
        {
            let inner = lock(&self.inner);
            if inner.status != ProcessStatus::Created {
                return Err(ShimError::WrongState {
                    process: self.describe(),
                    why: "was already started",
                });
            }
        }
        let Some(plan) = &self.plan else {
            let mut inner = lock(&self.inner);
            inner.status = ProcessStatus::Running;
            inner.pid = std::process::id();
            return Ok(inner.pid);
        };
        let mut outputs = OutputFifos::open(&self.stdio)?;
        let (input, control) = stdio::input(&self.stdio);
        *lock(&self.input) = Some(control.clone());
        let (started_tx, started_rx) = oneshot::channel::<(String, u32)>();
        let started_tx = Mutex::new(Some(started_tx));
        let request = plan.request();
        let me = self.clone();
        let (failed_tx, failed_rx) = oneshot::channel::<workspace::Error>();
        tokio::spawn(async move {
            let ran = match all.workspace(&workspace) {
                Ok(ws) => {
                    ws.exec(request, input, |event| match event {
                        ExecEvent::Started { exec_id, pid } => {
                            if let Some(tx) = lock(&started_tx).take() {
                                let _ = tx.send((exec_id, pid));
                            }
                        }
                        ExecEvent::Stdout(bytes) => outputs.stdout(bytes),
                        ExecEvent::Stderr(bytes) => outputs.stderr(bytes),
                    })
                    .await
                }
                Err(e) => Err(e),
            };
            outputs.finish().await;
            control.ended();
            let status = match ran {
                Ok(exited) => match (exited.code, exited.signal) {
                    (Some(code), _) => code as u32,
                    (None, Some(signal)) => 128 + signal as u32,
                    (None, None) => UNKNOWN_EXIT,
                },
                Err(e) => {
                    log::warn!("{}: {}", me.describe(), workspace::error_chain(&e));
                    let _ = failed_tx.send(e);
                    UNKNOWN_EXIT
                }
            };
            me.finish(status);
        });
        match started_rx.await {
            Ok((guest_exec_id, pid)) => {
                let mut inner = lock(&self.inner);
                if inner.status == ProcessStatus::Created {
                    inner.status = ProcessStatus::Running;
                }
                inner.pid = pid;
                inner.guest_exec_id = Some(guest_exec_id);
                Ok(pid)
            }
            // The exec ended without starting: why is in `failed_rx`.
            Err(_) => Err(match failed_rx.await {
                Ok(e) => ShimError::workspace(format!("start {}", self.describe()))(e),
                Err(_) => ShimError::WrongState {
                    process: self.describe(),
                    why: "ended before the agent reported it started",
                },
            }),
        }
    }

    /// Records its end (once) and wakes its waiters.
    pub fn finish(&self, status: u32) {
        lock(&self.inner).status = ProcessStatus::Stopped;
        self.exit.send_if_modified(|exit| {
            if exit.is_some() {
                return false;
            }
            *exit = Some(Exit {
                status,
                at: SystemTime::now(),
            });
            true
        });
    }

    /// Waits for its end.
    pub async fn wait(&self) -> Exit {
        let mut rx = self.exit.subscribe();
        loop {
            if let Some(exit) = *rx.borrow_and_update() {
                return exit;
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as `self`: not reached.
                return Exit {
                    status: UNKNOWN_EXIT,
                    at: SystemTime::now(),
                };
            }
        }
    }

    /// Sends `signal` to its process group in the guest. A process not
    /// started yet ends at once with 128 + `signal`, as runc's would.
    pub async fn kill(
        &self,
        all: &Workspaces,
        workspace: &str,
        signal: u32,
    ) -> Result<(), ShimError> {
        let (status, guest_exec_id) = {
            let inner = lock(&self.inner);
            (inner.status, inner.guest_exec_id.clone())
        };
        match (status, guest_exec_id) {
            (ProcessStatus::Created, _) => {
                self.finish(128 + signal);
                Ok(())
            }
            // pause ends with 0 on SIGINT and SIGTERM, and so does ours.
            (ProcessStatus::Running, None) if self.plan.is_none() => {
                let clean = [libc::SIGINT, libc::SIGTERM].contains(&(signal as i32));
                self.finish(if clean { 0 } else { 128 + signal });
                Ok(())
            }
            (ProcessStatus::Stopped, _) | (ProcessStatus::Running, None) => {
                Err(ShimError::Finished(self.describe()))
            }
            (ProcessStatus::Running, Some(id)) => all
                .workspace(workspace)
                .map_err(ShimError::workspace(format!("signal {}", self.describe())))?
                .signal_exec(&id, signal as i32)
                .await
                .map_err(ShimError::workspace(format!("signal {}", self.describe()))),
        }
    }

    /// Ends its stdin.
    pub fn close_stdin(&self) {
        if let Some(control) = lock(&self.input).as_ref() {
            control.close_stdin();
        }
    }

    /// Resizes its terminal.
    pub async fn resize(&self, rows: u16, cols: u16) -> Result<(), ShimError> {
        let control = lock(&self.input).clone();
        match control {
            Some(control) if control.resize(rows, cols).await => Ok(()),
            _ => Err(ShimError::WrongState {
                process: self.describe(),
                why: "has no running terminal to resize",
            }),
        }
    }

    fn describe(&self) -> String {
        match self.exec_id.as_str() {
            "" => "the container's process".to_owned(),
            id => format!("exec {id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> ProcessPlan {
        ProcessPlan {
            args: vec!["true".into()],
            env: Vec::new(),
            cwd: "/".into(),
            user: "0:0".into(),
            terminal: false,
            root: None,
        }
    }

    #[tokio::test]
    async fn a_pause_process_runs_nowhere_and_ends_as_pause_does() {
        let home = std::env::temp_dir().join(format!("ma-shim-pause-{}", std::process::id()));
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&home)
            .unwrap();
        let all = Arc::new(
            workspace::Workspaces::builder()
                .state_dir(&home)
                .build()
                .unwrap(),
        );
        let p = Process::pause(Stdio::default());
        assert_eq!(
            p.start(all.clone(), "none".into()).await.unwrap(),
            std::process::id()
        );
        assert_eq!(p.status(), ProcessStatus::Running);
        p.kill(&all, "none", libc::SIGTERM as u32).await.unwrap();
        assert_eq!(p.wait().await.status, 0);
        let q = Process::pause(Stdio::default());
        q.start(all.clone(), "none".into()).await.unwrap();
        q.kill(&all, "none", libc::SIGKILL as u32).await.unwrap();
        assert_eq!(q.wait().await.status, 137);
        assert!(matches!(
            q.kill(&all, "none", 9).await,
            Err(ShimError::Finished(_))
        ));
        std::fs::remove_dir_all(&home).unwrap();
    }

    #[tokio::test]
    async fn the_first_end_is_kept_and_wakes_every_waiter() {
        let p = Process::new("", plan(), Stdio::default());
        let waiter = {
            let p = p.clone();
            tokio::spawn(async move { p.wait().await })
        };
        p.finish(143);
        p.finish(0);
        assert_eq!(waiter.await.unwrap().status, 143);
        assert_eq!(p.wait().await.status, 143);
        assert_eq!(p.status(), ProcessStatus::Stopped);
    }
}
