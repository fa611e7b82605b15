//! The control socket's answers: each request acts on the shared state of
//! the run (the machine, the TTL, the ports, the egress filter).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use base::host::settings::now_ms;
use base::store::ports::PortError;
use base::store::ports::PortMapping;
use base::store::spec::validate_ttl;
use base::vmm::control::{ControlRequest, ControlResponse};

use crate::error::VmmProcessError;

use super::Shared;

fn no_filter() -> ControlResponse {
    ControlResponse::Error {
        message: "this workspace's network has no egress filter (the `none` network, or a tap network, whose policy nftables enforce)".into(),
    }
}

pub(super) fn handle_control(
    shared: &Arc<Shared>,
    req: ControlRequest,
    fd: Option<std::os::fd::OwnedFd>,
) -> ControlResponse {
    match req {
        ControlRequest::Status => ControlResponse::Status {
            pid: base::host::settings::own_pid(),
            uptime_ms: shared.started.elapsed().as_millis() as u64,
            ready: shared.ready.load(Ordering::SeqCst),
            stopping: shared.stopping.load(Ordering::SeqCst),
            ttl_deadline_ms: *shared
                .ttl_deadline
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        },
        ControlRequest::SetEgress { egress, allow } => match &shared.egress {
            Some(control) => control.set(egress, &allow),
            None => no_filter(),
        },
        ControlRequest::EgressDenials => match &shared.egress {
            Some(control) => control.denials(),
            None => no_filter(),
        },
        ControlRequest::Snapshot { dir } => {
            let Some(machine) = shared.machine.get() else {
                return ControlResponse::Error {
                    message: "the VM is not running".into(),
                };
            };
            if !shared.ready.load(Ordering::SeqCst)
                || shared.stopping.load(Ordering::SeqCst)
                || shared.hibernating.load(Ordering::SeqCst)
            {
                return ControlResponse::Error {
                    message: "the workspace is starting, stopping or hibernating".into(),
                };
            }
            match machine.snapshot(&dir) {
                Ok(taken) => {
                    crate::pause_point("vmm:snapshot");
                    ControlResponse::Snapshot {
                        paused_us: taken.paused.as_micros() as u64,
                        total_us: taken.total.as_micros() as u64,
                        memory_data_bytes: taken.memory.data_bytes,
                    }
                }
                Err(e) => ControlResponse::Error {
                    message: format!(
                        "workspace `{}` could not be snapshotted: {}",
                        shared.ws.name(),
                        base::error_chain::error_chain(&e)
                    ),
                },
            }
        }
        ControlRequest::Hibernate => match super::hibernate::hibernate(shared, None) {
            Ok(w) => ControlResponse::Snapshot {
                paused_us: w.total_us,
                total_us: w.total_us,
                memory_data_bytes: w.memory_bytes,
            },
            Err(message) => ControlResponse::Error {
                message: format!(
                    "workspace `{}` could not hibernate: {message}",
                    shared.ws.name()
                ),
            },
        },
        ControlRequest::Publish { mapping } => match fd {
            Some(fd) => publish(shared, mapping, std::net::TcpListener::from(fd)),
            None => ControlResponse::Error {
                message: "publish needs the listening socket sent with the request".into(),
            },
        },
        ControlRequest::Unpublish { host_ip, host_port } => {
            shared
                .ports
                .unpublish(std::net::SocketAddr::new(host_ip, host_port));
            ControlResponse::Ok {
                ttl_deadline_ms: None,
            }
        }
        ControlRequest::Pause | ControlRequest::Resume => {
            let Some(machine) = shared.machine.get() else {
                return ControlResponse::Error {
                    message: "the VM is not running".into(),
                };
            };
            let pausing = matches!(req, ControlRequest::Pause);
            let _turn = shared.transition.lock().unwrap_or_else(|p| p.into_inner());
            let was_paused = shared.paused.load(Ordering::SeqCst);
            let done = if pausing {
                machine.pause()
            } else {
                machine.resume()
            };
            if done.is_ok() && !pausing && was_paused {
                tell_the_time(shared);
            }
            if done.is_ok() {
                shared.paused.store(pausing, Ordering::SeqCst);
                // A pause on request waits for `resume`; the idle watcher
                // records the change.
                shared.idle_paused.store(false, Ordering::SeqCst);
            }
            match done {
                Ok(()) => ControlResponse::Ok {
                    ttl_deadline_ms: None,
                },
                Err(e) => ControlResponse::Error {
                    message: base::error_chain::error_chain(&e),
                },
            }
        }
        ControlRequest::Memory => super::memory::figures(shared),
        ControlRequest::Stop { timeout_ms } => {
            shared.begin_stop(Duration::from_millis(timeout_ms), "stopped on request");
            ControlResponse::Ok {
                ttl_deadline_ms: None,
            }
        }
        ControlRequest::SetTtl { ttl_secs } => {
            if let Some(Err(e)) = ttl_secs.map(validate_ttl) {
                return ControlResponse::Error {
                    message: e.to_string(),
                };
            }
            let at = ttl_secs.map(|s| now_ms() + s * 1000);
            let recorded = shared.update(|m| {
                if let Some(rt) = m.runtime.as_mut() {
                    rt.ttl_deadline_ms = at;
                }
                Ok(())
            });
            if let Err(e) = recorded {
                return ControlResponse::Error {
                    message: e.full_message(),
                };
            }
            *shared
                .ttl_deadline
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = at;
            shared.ttl_changed.notify_all();
            ControlResponse::Ok {
                ttl_deadline_ms: at,
            }
        }
    }
}

/// After a resume on request: the guest's clock stood still through the
/// pause (`MachineHandle::clock_stops_with_pauses`), and a hello sets its
/// wall clock to the host's; sent now, from a thread of its own (the
/// resume's answer does not wait for the guest), rather than with the
/// next call, for the guest's own programs. A claimed pool member skips
/// it: the claim's first request carries its identity and the time.
fn tell_the_time(shared: &Arc<Shared>) {
    if shared.ws.pending_identity().is_some() {
        return;
    }
    let ws = shared.ws.clone();
    let told = std::thread::Builder::new()
        .name("tell-time".into())
        .spawn(move || {
            if let Err(e) = crate::guest_ready::hello(&ws) {
                tracing::warn!("no hello after the resume (the next call sets the clock): {e}");
            }
        });
    if let Err(e) = told {
        tracing::warn!("no hello after the resume (the next call sets the clock): {e}");
    }
}

fn publish(
    shared: &Shared,
    mapping: PortMapping,
    listener: std::net::TcpListener,
) -> ControlResponse {
    match shared.ports.publish(mapping, listener) {
        Ok(()) => ControlResponse::Ok {
            ttl_deadline_ms: None,
        },
        Err(VmmProcessError::Port(PortError::Unavailable { addr, source })) => {
            ControlResponse::PortUnavailable {
                addr,
                in_use: source.kind() == std::io::ErrorKind::AddrInUse,
                message: source.to_string(),
            }
        }
        Err(e) => ControlResponse::Error {
            message: e.full_message(),
        },
    }
}
