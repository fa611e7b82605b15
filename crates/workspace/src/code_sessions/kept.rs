//! Connections to kernels kept between the runs of one process (the MCP
//! server runs every call of its clients): a run that ended in order
//! leaves its connection here, and the session's next run within
//! [`KEEP_FOR`] uses it instead of connecting anew (three tunnels through
//! the agent, their handshakes and a `kernel_info` round trip). It is
//! taken only for the same kernel (the session's record unchanged) in the
//! same VMM process, and read up to date first when anything came on it
//! meanwhile; a run that failed, timed out or was cancelled keeps nothing.
//!
//! An open tunnel is use to the workspace's idle watch, so a kept
//! connection is closed after [`KEEP_FOR`]: the workspace's idle time
//! starts then.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixStream;

use super::jupyter::JupyterClient;
use super::records::SessionRecord;

/// How long a connection is kept after its run.
pub const KEEP_FOR: Duration = Duration::from_secs(60);
/// The most connections one process keeps.
const MAX_KEPT: usize = 32;

/// The VMM process a connection went through (its pid and start), so a
/// workspace restarted, hibernated or woken since never reuses it.
pub(crate) type VmmIdentity = Option<(u32, u64)>;

struct Kept<C> {
    record: SessionRecord,
    vmm: VmmIdentity,
    client: C,
    /// Which keeping this is: the timer that ends it ends only its own.
    turn: u64,
}

/// Ends one keeping when dropped, unless the session's connection was
/// kept again since.
struct Expiry<C> {
    kept: std::sync::Weak<KeptKernels<C>>,
    key: (PathBuf, String),
    turn: u64,
}

impl<C> Drop for Expiry<C> {
    fn drop(&mut self) {
        let Some(kept) = self.kept.upgrade() else {
            return;
        };
        let ended = {
            let mut guard = kept.lock();
            match guard.1.get(&self.key) {
                Some(k) if k.turn == self.turn => guard.1.remove(&self.key),
                _ => None,
            }
        };
        drop(ended);
    }
}

/// This process's kept connections: one table for all its `Workspaces`
/// (their keys are workspace directories, which differ between state
/// directories).
pub(crate) fn of_this_process() -> &'static Arc<KeptKernels> {
    static KEPT: std::sync::OnceLock<Arc<KeptKernels>> = std::sync::OnceLock::new();
    KEPT.get_or_init(Default::default)
}

/// Kept connections (`C`: a kernel client; another type in unit tests).
pub(crate) struct KeptKernels<C = JupyterClient<UnixStream>> {
    kept: Mutex<Table<C>>,
}

/// The keepings made so far, and what is kept by workspace directory and
/// session id.
type Table<C> = (u64, HashMap<(PathBuf, String), Kept<C>>);

impl<C> Default for KeptKernels<C> {
    fn default() -> Self {
        Self {
            kept: Mutex::new((0, HashMap::new())),
        }
    }
}

impl<C> std::fmt::Debug for KeptKernels<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kept = self.lock().1.len();
        f.debug_struct("KeptKernels").field("kept", &kept).finish()
    }
}

impl<C> KeptKernels<C> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table<C>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<C: Send + 'static> KeptKernels<C> {
    /// The connection kept for `record`'s session of the workspace at
    /// `ws_dir`, if it was made to that same kernel through `vmm`; any
    /// other kept for the session is closed.
    pub(crate) fn take(
        &self,
        ws_dir: &Path,
        record: &SessionRecord,
        vmm: VmmIdentity,
    ) -> Option<C> {
        let kept = self
            .lock()
            .1
            .remove(&(ws_dir.to_path_buf(), record.id.clone()))?;
        (kept.record == *record && kept.vmm == vmm).then_some(kept.client)
    }

    /// Keeps `client` for the session's next run, for [`KEEP_FOR`].
    pub(crate) fn keep(
        self: &Arc<Self>,
        ws_dir: &Path,
        record: SessionRecord,
        vmm: VmmIdentity,
        client: C,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let key = (ws_dir.to_path_buf(), record.id.clone());
        let turn = {
            let mut guard = self.lock();
            let (turns, kept) = &mut *guard;
            if kept.len() >= MAX_KEPT && !kept.contains_key(&key) {
                return;
            }
            *turns += 1;
            let turn = *turns;
            kept.insert(
                key.clone(),
                Kept {
                    record,
                    vmm,
                    client,
                    turn,
                },
            );
            turn
        };
        // Ended when its time is over, or when the runtime that would have
        // ended it goes (its task is dropped then): never left open.
        let expiry = Expiry {
            kept: Arc::downgrade(self),
            key,
            turn,
        };
        runtime.spawn(async move {
            tokio::time::sleep(KEEP_FOR).await;
            drop(expiry);
        });
    }

    /// Closes the connection kept for session `id` of the workspace at
    /// `ws_dir` (its kernel stopped or restarted).
    pub(crate) fn forget(&self, ws_dir: &Path, id: &str) {
        self.lock().1.remove(&(ws_dir.to_path_buf(), id.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::code_sessions::CodeLanguage;

    fn record(pid: u32) -> SessionRecord {
        SessionRecord {
            id: "code-1".into(),
            language: CodeLanguage::Python,
            process: None,
            pid,
            started_unix_ms: 1,
            created_unix_ms: 1,
            key: "k".into(),
            shell_port: 1,
            iopub_port: 2,
            control_port: 3,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_connection_serves_only_the_same_kernel_in_the_same_vmm_for_a_while() {
        let kept = Arc::new(KeptKernels::<u32>::default());
        let dir = Path::new("/state/workspaces/dev");
        let vmm = Some((10, 100));
        // Taken once, for the same record and VMM.
        kept.keep(dir, record(7), vmm, 1);
        assert_eq!(kept.take(dir, &record(7), vmm), Some(1));
        assert_eq!(kept.take(dir, &record(7), vmm), None);
        // Another kernel (a restart), another VMM process (a start since),
        // another workspace: none, and what was kept is closed.
        kept.keep(dir, record(7), vmm, 2);
        assert_eq!(kept.take(dir, &record(8), vmm), None);
        assert_eq!(kept.take(dir, &record(7), vmm), None);
        kept.keep(dir, record(7), vmm, 3);
        assert_eq!(kept.take(dir, &record(7), Some((11, 100))), None);
        kept.keep(dir, record(7), vmm, 4);
        assert_eq!(
            kept.take(Path::new("/state/workspaces/other"), &record(7), vmm),
            None
        );
        kept.forget(dir, "code-1");
        assert_eq!(kept.take(dir, &record(7), vmm), None);
        // Closed after its time, and a later keeping is not closed by an
        // earlier one's timer.
        kept.keep(dir, record(7), vmm, 5);
        tokio::time::sleep(KEEP_FOR + Duration::from_secs(1)).await;
        assert_eq!(kept.take(dir, &record(7), vmm), None);
        kept.keep(dir, record(7), vmm, 6);
        tokio::time::sleep(KEEP_FOR / 2).await;
        kept.keep(dir, record(7), vmm, 7);
        tokio::time::sleep(KEEP_FOR / 2 + Duration::from_secs(1)).await;
        assert_eq!(kept.take(dir, &record(7), vmm), Some(7));
    }

    #[test]
    fn a_runtime_that_ends_ends_what_it_kept() {
        let kept = Arc::new(KeptKernels::<u32>::default());
        let dir = Path::new("/state/workspaces/dev");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async { kept.keep(dir, record(7), None, 1) });
        assert_eq!(kept.lock().1.len(), 1);
        drop(runtime);
        assert_eq!(kept.lock().1.len(), 0);
    }

    #[tokio::test]
    async fn no_more_than_the_most_are_kept() {
        let kept = Arc::new(KeptKernels::<u32>::default());
        for n in 0..MAX_KEPT + 5 {
            let dir = PathBuf::from(format!("/state/workspaces/w{n}"));
            kept.keep(&dir, record(7), None, n as u32);
        }
        assert_eq!(kept.lock().1.len(), MAX_KEPT);
    }
}
