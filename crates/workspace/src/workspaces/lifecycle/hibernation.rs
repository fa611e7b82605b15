//! Hibernation (docs/snapshots.md, "Hibernation"): a running workspace's
//! machine written into its own directory and its VMM gone, so it costs
//! the host no memory and no CPU; the next call on it restores it in
//! place (same name, disk, processes, network identity and ports). There
//! is no daemon: the process that makes the call (the CLI, the MCP
//! server, a program on the library) restores it, and the VMM it starts
//! outlives that process as any start's does.

use std::time::{Duration, Instant};

use super::{Boot, StartProgress, DEFAULT_START_TIMEOUT};
use crate::error::{Error, Result};
use crate::workspaces::handle::Workspace;
use crate::workspaces::manager::Workspaces;
use base::store::process;
use base::store::spec::{Meta, StartKind};
use base::store::state::State;
use base::store::workspace_dir::WorkspaceDir;
use base::vmm::control::{self, ControlRequest, ControlResponse};

/// How long the VMM may take to write the machine (its memory, a few
/// hundred MiB, on a slow disk) and end.
pub const DEFAULT_HIBERNATE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a wake waits for the VMM that hibernated the workspace to end.
const VMM_EXIT_WAIT: Duration = Duration::from_secs(30);

impl Workspace<'_> {
    /// Writes its machine into its directory and ends its VMM: the
    /// workspace is `hibernated` and costs nothing until the next call on
    /// it (or `start`, `resume`) restores it as it was. Hibernating a
    /// hibernated workspace does nothing.
    pub async fn hibernate(self, timeout: Duration) -> Result<Meta> {
        if let Some(remote) = self.remote()? {
            let call = crate::servers::WorkspaceCall::Hibernate {
                timeout_ms: crate::servers::millis(timeout),
            };
            return Ok(remote.call(call).await?);
        }
        let (all, name) = (self.all, self.name.as_str());
        let meta = self.get_here()?;
        match meta.state {
            State::Hibernated => return Ok(meta),
            State::Running => {}
            state => {
                return Err(Error::WrongState {
                    name: name.to_owned(),
                    state,
                    why: "only a running workspace hibernates",
                    remedy: None,
                })
            }
        }
        if !meta.spec.may_hibernate() {
            return Err(Error::InvalidInput(format!(
                "workspace `{name}` has services, or is a service's machine: they serve each other, so it cannot hibernate (stop it instead)"
            )));
        }
        let Some(rt) = meta.runtime.clone() else {
            return Err(Error::NotRunning {
                name: name.to_owned(),
                state: meta.state,
            });
        };
        let ws = all.dir(name)?;
        let answer = all
            .blocking(move |_| {
                Ok(control::call(
                    &ws.control(),
                    &ControlRequest::Hibernate,
                    timeout,
                )?)
            })
            .await?;
        if let ControlResponse::Error { message } = answer {
            return Err(control::ControlError::Refused(message).into());
        }
        // Recorded by the VMM before it ends; waited for until it is gone,
        // so the caller's next step meets no VMM on the same disk.
        let deadline = Instant::now() + timeout;
        loop {
            let meta = self.get_here()?;
            let gone = !process::not_yet_gone(rt.pid, rt.pid_start);
            let another_run = meta.runtime.as_ref().is_some_and(|r| r.pid != rt.pid);
            match meta.state {
                State::Hibernated if gone => return Ok(meta),
                // Hibernated, then woken by another call already.
                State::Starting | State::Running if another_run => return Ok(meta),
                State::Running | State::Hibernated => {}
                _ => {
                    return Err(Error::StartFailed {
                        name: name.to_owned(),
                        reason: meta.last_exit.map_or_else(
                            || format!("hibernating, it became {}", meta.state),
                            |e| format!("hibernating, its VMM ended: {}", e.reason),
                        ),
                    })
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout(format!(
                    "workspace `{name}` did not finish hibernating in {} s",
                    timeout.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Workspace<'_> {
    /// Runs its vCPUs again after [`Workspace::pause`], or restores it
    /// from its hibernation (resuming one that runs does nothing).
    pub async fn resume(self) -> Result<()> {
        let (all, name) = (self.all, self.name.as_str());
        all.awake(name).await?;
        all.pause_or_resume(name, ControlRequest::Resume)
    }
}

impl Workspaces {
    /// [`Workspaces::running`], restoring a hibernated workspace first
    /// (what every call that reaches a guest goes through): the caller
    /// sees only the latency.
    pub(crate) async fn awake(&self, name: &str) -> Result<(WorkspaceDir, Meta)> {
        let meta = self.at(name).get_here()?;
        let waking = meta.state == State::Starting
            && meta
                .runtime
                .as_ref()
                .is_some_and(|r| r.start_kind == Some(StartKind::Hibernation));
        if meta.state == State::Hibernated || waking {
            self.wake(name, DEFAULT_START_TIMEOUT, |_| {}).await?;
        }
        self.running(name)
    }

    /// Restores the hibernated workspace `name` in place and waits for its
    /// agent; one woken by another caller meanwhile is waited for.
    pub(crate) async fn wake(
        &self,
        name: &str,
        timeout: Duration,
        mut progress: impl FnMut(StartProgress) + Send,
    ) -> Result<Meta> {
        let started = Instant::now();
        // The VMM that wrote it records it before it exits: it goes first
        // (its sockets, its group).
        if let Some((pid, pid_start)) = self.at(name).get_here()?.hibernation.and_then(|h| h.vmm) {
            let deadline = Instant::now() + VMM_EXIT_WAIT;
            while process::not_yet_gone(pid, pid_start) {
                if Instant::now() > deadline {
                    return Err(Error::Timeout(format!(
                        "the VMM process {pid} that hibernated workspace `{name}` has not exited after {} s",
                        VMM_EXIT_WAIT.as_secs()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.discard_if_owner_gone(name)?;
        let launched = self.launch_vmm(name, |meta| {
            if meta.state != State::Hibernated {
                return Err(Error::WrongState {
                    name: name.to_owned(),
                    state: meta.state,
                    why: "it is not hibernated",
                    remedy: None,
                });
            }
            Ok(Boot {
                kind: StartKind::Hibernation,
                restore: Some(self.dir(name)?.hibernation()),
                keep_warm: None,
                warm_held: None,
            })
        });
        match launched {
            Ok(_) => {}
            // Woken (or being woken) by another call.
            Err(Error::WrongState {
                state: State::Starting | State::Running,
                ..
            }) => {}
            Err(e) => return Err(e),
        }
        // A slow restore is left to finish: halting it would discard the
        // machine (and another caller may be waiting on it).
        self.wait_until_running(name, started, timeout, &mut progress, false)
            .await
    }

    /// A workspace that lived for a process (`run`, an MCP session's) and
    /// whose process ended while it was hibernated is not restored: its
    /// VMM would have stopped it then. It is recorded stopped, its
    /// hibernation discarded (a session's workspace then goes at the next
    /// listing, as any whose owner ended), and the caller is told.
    pub(crate) fn discard_if_owner_gone(&self, name: &str) -> Result<()> {
        let ws = self.dir(name)?;
        let (_lock, mut meta) = self.lock_existing(name)?;
        let Some(owner) = meta.spec.owner else {
            return Ok(());
        };
        if meta.state != State::Hibernated || process::pidfd(owner.pid, owner.start_ticks).is_some()
        {
            return Ok(());
        }
        ws.record_hibernation_discarded(&mut meta, OWNER_ENDED)?;
        Err(Error::WrongState {
            name: name.to_owned(),
            state: meta.state,
            why: OWNER_ENDED,
            remedy: None,
        })
    }
}

/// Why a hibernated workspace whose owner ended is not restored.
const OWNER_ENDED: &str = "the process it ran for ended while it was hibernated: it was stopped";

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::workspaces::manager::tests::{fixture, have_mkfs, spec};
    use base::store::spec::{Hibernation, Owner};
    use base::store::state::State;

    #[test]
    fn a_hibernated_workspace_whose_owner_ended_is_stopped_not_restored() {
        if !have_mkfs("a_hibernated_workspace_whose_owner_ended_is_stopped_not_restored") {
            return;
        }
        let f = fixture("owner-hibernated", "/nonexistent");
        let hibernated = |name: &str, owner: Owner| {
            f.ws.create(name, spec()).unwrap();
            let ws = f.ws.dir(name).unwrap();
            let mut meta = ws.read_meta().unwrap();
            meta.spec.owner = Some(owner);
            meta.state = State::Hibernated;
            meta.hibernation = Some(Hibernation::new(1, "idle", None));
            ws.write_meta(&meta).unwrap();
            std::fs::create_dir_all(ws.hibernation()).unwrap();
            ws
        };
        // An owner that has ended: a pid above the kernel's limit.
        let gone = hibernated(
            "gone",
            Owner {
                pid: 99_999_999,
                start_ticks: 1,
            },
        );
        let refused = f.ws.discard_if_owner_gone("gone").unwrap_err();
        assert!(
            matches!(
                refused,
                Error::WrongState {
                    state: State::Stopped,
                    ..
                }
            ),
            "{refused:?}"
        );
        let meta = gone.read_meta().unwrap();
        assert_eq!((meta.state, meta.hibernation), (State::Stopped, None));
        assert!(meta
            .last_exit
            .unwrap()
            .reason
            .contains("ended while it was hibernated"));
        assert!(!gone.hibernation().exists());
        // An owner still there (this test): restored as usual.
        let me = std::process::id();
        let ticks = base::store::process::start_ticks(me).unwrap();
        let kept = hibernated(
            "kept",
            Owner {
                pid: me,
                start_ticks: ticks,
            },
        );
        f.ws.discard_if_owner_gone("kept").unwrap();
        assert_eq!(kept.read_meta().unwrap().state, State::Hibernated);
        assert!(kept.hibernation().exists());
    }
}
