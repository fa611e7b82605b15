//! Hibernation: the guest's machine (memory and device state; the disks
//! stay where they are) written into the workspace's own directory, the
//! record saying `hibernated`, then the VMM ends without shutting the
//! guest down. The next start restores it in place (the library's
//! `workspaces::hibernation`). Written beside the old one and renamed at
//! the end: a VMM killed meanwhile leaves a crashed workspace and a
//! temporary directory, never a record that names half a machine.

use std::os::unix::fs::DirBuilderExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use base::host::settings::now_ms;
use base::store::spec::Hibernation;

use super::Shared;

/// What one hibernation wrote.
pub(super) struct Written {
    pub total_us: u64,
    pub memory_bytes: u64,
}

/// Writes the machine into the workspace's hibernation directory and ends
/// the run; `by` says what asked (`request`, `idle`). On failure the guest
/// runs on as it was (paused if it was) and the reason comes back.
pub(super) fn hibernate(shared: &Arc<Shared>, by: &'static str) -> Result<Written, String> {
    if !shared.can_hibernate {
        return Err("a workspace with services cannot hibernate (their machines run apart); stop it instead".into());
    }
    let Some(machine) = shared.machine.get() else {
        return Err("the VM is not running".into());
    };
    if !shared.ready.load(Ordering::SeqCst) {
        return Err("the workspace is starting".into());
    }
    if shared.stopping.swap(true, Ordering::SeqCst) {
        return Err("the workspace is stopping".into());
    }
    let turn = shared.transition.lock().unwrap_or_else(|p| p.into_inner());
    let was_paused = shared.paused.load(Ordering::SeqCst);
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
        Ok(Written {
            total_us: taken.total.as_micros() as u64,
            memory_bytes: taken.memory.data_bytes,
        })
    })();
    // Recorded before the VMM ends, so a kill from here on leaves it
    // hibernated and whole; a wake waits for this process to be gone.
    let written = written.and_then(|w| {
        let recorded = (|| {
            let _lock = shared.state.lock_workspace(shared.ws.name())?;
            let mut meta = shared.ws.read_meta()?;
            let hibernation = Hibernation::new(at, by, meta.runtime.as_ref());
            shared.ws.record_hibernated(
                &mut meta,
                hibernation,
                w.memory_bytes,
                w.total_us / 1000,
            )?;
            Ok::<(), crate::error::VmmProcessError>(())
        })();
        match recorded {
            Ok(()) => Ok(w),
            Err(e) => {
                let _ = std::fs::remove_dir_all(shared.ws.hibernation());
                Err(format!("recording it: {}", e.full_message()))
            }
        }
    });
    match written {
        Ok(w) => {
            shared.finished.store(true, Ordering::SeqCst);
            *shared.stop_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some("hibernated");
            drop(turn);
            tracing::info!(by, memory_bytes = w.memory_bytes, "hibernated");
            crate::pause_point("vmm:hibernated");
            shared.tear_down();
            Ok(w)
        }
        Err(why) => {
            let _ = std::fs::remove_dir_all(&writing);
            if !was_paused {
                if let Err(e) = machine.resume() {
                    tracing::error!("resuming after a failed hibernation: {e}");
                }
            }
            shared.stopping.store(false, Ordering::SeqCst);
            drop(turn);
            tracing::error!(%why, "could not hibernate");
            Err(why)
        }
    }
}
