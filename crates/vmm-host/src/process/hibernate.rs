//! Hibernation: the guest's machine (memory and device state; the disks
//! stay where they are) written into the workspace's own directory, the
//! record saying `hibernated`, then the VMM ends without shutting the
//! guest down. The next start restores it in place (the library's
//! `workspaces::lifecycle::hibernation`). Written beside the old one,
//! renamed, then recorded: a VMM killed before the record leaves a crashed
//! workspace and a temporary directory, one killed after it a hibernated
//! workspace, never a record that names half a machine.

use std::os::unix::fs::DirBuilderExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use base::host::settings::now_ms;
use base::store::spec::Hibernation;
use vmm_core::devices::virtio::vsock::HostArrivals;

use super::Shared;

/// What one hibernation wrote.
pub(super) struct Written {
    pub total_us: u64,
    pub memory_bytes: u64,
}

/// Free space the host keeps beyond a hibernation's memory file.
const FREE_FLOOR: u64 = 256 << 20;

/// Writes the machine into the workspace's hibernation directory and ends
/// the run: on request, or (`idle`, the socket its calls arrive on) once
/// idle, when nothing arrived while it was written. On failure the guest
/// runs on as it was (paused if it was) and the reason comes back.
pub(super) fn hibernate(
    shared: &Arc<Shared>,
    idle: Option<&HostArrivals>,
) -> Result<Written, String> {
    let by = if idle.is_some() { "idle" } else { "request" };
    if !shared.can_hibernate {
        return Err("a workspace with services, or a service's machine, cannot hibernate (their machines serve each other); stop it instead".into());
    }
    let Some(machine) = shared.machine.get() else {
        return Err("the VM is not running".into());
    };
    if !shared.ready.load(Ordering::SeqCst) {
        return Err("the workspace is starting".into());
    }
    if shared.stopping.load(Ordering::SeqCst) {
        return Err("the workspace is stopping".into());
    }
    let mem_bytes = shared
        .ws
        .read_meta()
        .map_err(|e| e.to_string())?
        .spec
        .mem_mib
        << 20;
    let free = base::host::settings::free_bytes(shared.ws.path()).unwrap_or(0);
    if free < mem_bytes.saturating_add(FREE_FLOOR) {
        return Err(format!(
            "{} MiB free where its memory file goes; it needs up to {} MiB and {} MiB to spare",
            free >> 20,
            mem_bytes >> 20,
            FREE_FLOOR >> 20
        ));
    }
    if shared.hibernating.swap(true, Ordering::SeqCst) {
        return Err("it is hibernating already".into());
    }
    let turn = shared.transition.lock().unwrap_or_else(|p| p.into_inner());
    let was_paused = shared.paused.load(Ordering::SeqCst);
    let seen = idle.map(HostArrivals::accepted);
    let at = now_ms();
    let ws = shared.ws.path();
    // Written aside; the previous one (this run's restore source) moves
    // aside while the new one takes its name.
    let [writing, replaced] = shared.ws.hibernation_scratch();
    let written = (|| -> Result<Written, String> {
        let _ = std::fs::remove_dir_all(&writing);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&writing)
            .map_err(|e| format!("creating {}: {e}", writing.display()))?;
        let taken = machine
            .hibernate(&writing)
            .map_err(|e| base::error_chain::error_chain(&e))?;
        crate::pause_point("vmm:hibernation-written");
        base::vmm::seal::sync_tree(&writing)
            .map_err(|e| format!("syncing {}: {e}", writing.display()))?;
        // A call that came while the machine was written is served, not
        // left in the socket's queue of a VMM about to end.
        if let (Some(arrivals), Some(seen)) = (idle, seen) {
            let waiting = arrivals.wait(Duration::ZERO).unwrap_or(true);
            if waiting || arrivals.accepted() != seen || arrivals.open() > 0 {
                return Err("a call arrived while it was written".into());
            }
        }
        let dir = shared.ws.hibernation();
        // This run's restore source is mapped privately: its pages stay
        // readable to this process after the rename and the removal.
        if dir.exists() {
            let _ = std::fs::remove_dir_all(&replaced);
            std::fs::rename(&dir, &replaced)
                .map_err(|e| format!("moving {} aside: {e}", dir.display()))?;
        }
        std::fs::rename(&writing, &dir)
            .map_err(|e| format!("moving the hibernation to {}: {e}", dir.display()))?;
        base::vmm::seal::sync_dir(ws).map_err(|e| format!("syncing {}: {e}", ws.display()))?;
        let _ = std::fs::remove_dir_all(&replaced);
        // The point of no return: once the record says hibernated, a kill
        // leaves it whole. A stop that came first (the record says
        // stopping) wins.
        let _lock = shared
            .state
            .lock_workspace(shared.ws.name())
            .map_err(|e| e.to_string())?;
        let mut meta = shared.ws.read_meta().map_err(|e| e.to_string())?;
        let hibernation = Hibernation::new(at, by, meta.runtime.as_ref());
        let total_us = taken.total.as_micros() as u64;
        shared
            .ws
            .record_hibernated(
                &mut meta,
                hibernation,
                taken.memory.data_bytes,
                total_us / 1000,
            )
            .map_err(|e| format!("recording it: {e}"))?;
        Ok(Written {
            total_us,
            memory_bytes: taken.memory.data_bytes,
        })
    })();
    match written {
        Ok(w) => {
            shared.finished.store(true, Ordering::SeqCst);
            *shared.stop_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some("hibernated");
            tracing::info!(by, memory_bytes = w.memory_bytes, "hibernated");
            crate::pause_point("vmm:hibernated");
            // Ended before the turn is given up: nothing resumes the guest
            // past the memory just written.
            shared.tear_down();
            drop(turn);
            Ok(w)
        }
        Err(why) => {
            // Whatever was written or moved aside: the run goes on, and
            // its end would remove it anyway.
            shared.ws.remove_hibernation();
            if !was_paused {
                if let Err(e) = machine.resume() {
                    tracing::error!("resuming after a failed hibernation: {e}");
                }
            }
            shared.hibernating.store(false, Ordering::SeqCst);
            drop(turn);
            tracing::warn!(%why, "could not hibernate");
            Err(why)
        }
    }
}
