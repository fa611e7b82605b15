//! What the VMM asks of the guest once its agent answers: a restored
//! guest's fresh identity, and the named volumes it mounts; and the
//! largest disk the process may write (a snapshot copies each writable
//! volume).

use std::time::Duration;

use base::store::spec::WorkspaceSpec;
use base::store::workspace_dir::WorkspaceDir;
use base::store::StateDir;
use base::volumes::VolumeStore;
use guest_agent::client::blocking::BlockingClient;
use guest_agent::client::{AgentHello, ClientError};
use guest_agent::protocol::{AgentErrorCode, VolumeToMount};

/// How long one call to the agent may wait for each read or write.
pub(crate) const AGENT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the guest may take to mount them (a disk attached at a
/// restore shows its size within moments). Generous: the agent has just
/// answered, and right after a cold boot on a loaded host (two cores, the
/// guest's kernel emulated) a mount took more than 30 s in CI.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(120);

/// What the guest mounts, in slot order.
pub(crate) fn to_mount(spec: &WorkspaceSpec) -> Vec<VolumeToMount> {
    spec.volumes
        .iter()
        .map(|m| VolumeToMount {
            serial: m.serial(),
            path: m.path.clone(),
            read_only: m.read_only,
        })
        .collect()
}

/// Asks the guest to mount `volumes`; the error says why it did not.
pub(crate) fn mount(ws: &WorkspaceDir, volumes: &[VolumeToMount]) -> Result<(), String> {
    if volumes.is_empty() {
        return Ok(());
    }
    ws.agent_blocking(MOUNT_TIMEOUT)
        .and_then(|agent| agent.mount_volumes(volumes.to_vec()))
        .map_err(|e| base::error_chain::error_chain(&e))
}

/// The largest of the workspace's writable disks, MiB: its own, and each
/// read-write volume's.
pub(crate) fn largest_disk_mib(state: &StateDir, ws: &WorkspaceDir, spec: &WorkspaceSpec) -> u64 {
    let store = VolumeStore::new(state);
    spec.volumes
        .iter()
        .enumerate()
        .filter(|(_, m)| !m.read_only)
        .filter_map(|(slot, m)| store.mount_disk(ws, slot, m).ok())
        .filter_map(|disk| std::fs::metadata(disk).ok())
        .map(|meta| meta.len().div_ceil(1 << 20))
        .fold(spec.disk_mib, u64::max)
}

/// The agent's hello, when it answers one.
pub(crate) fn hello(ws: &WorkspaceDir) -> Result<AgentHello, ClientError> {
    ws.agent_blocking(AGENT_CALL_TIMEOUT)
        .and_then(BlockingClient::hello)
}

/// A restored guest takes this workspace's name as its hostname, fresh
/// host randomness and the host's clock, so forks of one snapshot differ.
/// It is also the restored guest's readiness probe (each round trip to an
/// emulated guest kernel costs hundreds of ms): `Err` only when the agent
/// did not answer, to be tried again; an agent that answers with a
/// refusal is logged and counts as up. The agent's hello when it took it.
pub(crate) fn give_identity(
    ws: &WorkspaceDir,
    net: Option<&base::network::Addressing>,
) -> Result<Option<AgentHello>, ClientError> {
    let mut entropy = [0u8; 64];
    // SAFETY: getrandom writes at most `entropy.len()` bytes into it.
    let got = unsafe { libc::getrandom(entropy.as_mut_ptr().cast(), entropy.len(), 0) };
    if got != entropy.len() as isize {
        tracing::error!("no host randomness for the restored guest");
        return hello(ws).map(Some);
    }
    let given = ws.agent_blocking(AGENT_CALL_TIMEOUT).and_then(|agent| {
        let network = net.map(|a| {
            (
                base::network::net_setting(a),
                base::network::mac_for(ws.name()),
            )
        });
        agent.restored(ws.name(), &entropy, network)
    });
    match given {
        Ok(hello) => {
            tracing::info!("restored guest took its identity");
            return Ok(Some(hello));
        }
        // Too many connections: said before it read the call; again.
        Err(
            e @ ClientError::Agent {
                code: AgentErrorCode::TooLarge,
                ..
            },
        ) => return Err(e),
        Err(e @ (ClientError::Agent { .. } | ClientError::Unexpected { .. })) => {
            tracing::error!(error = %e, "the restored guest did not take its identity");
        }
        Err(e) => return Err(e),
    }
    Ok(None)
}
