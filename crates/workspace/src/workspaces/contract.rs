//! `contract`: the runtime facts tools rely on, as one JSON document.

use serde::Serialize;

use base::code::ErrorCode;
use base::store::console_log::CONSOLE_LOG_CAP;
use base::store::spec::{defaults, Limits, LIMITS};
use base::store::state::State;
use base::store::workspace_dir::AGENT_PORT;

/// The contract document.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Contract {
    /// Version of the contract format.
    pub contract_version: u32,
    /// microagent's version.
    pub microagent_version: &'static str,
    /// Guest agent protocol version.
    pub agent_protocol_version: u32,
    /// Every workspace state, and which have a VMM process.
    pub states: Vec<StateEntry>,
    /// Legal state changes, as [from, to] pairs.
    pub transitions: Vec<(State, State)>,
    /// Every stable error code.
    pub error_codes: Vec<ErrorCode>,
    /// Input limits.
    pub limits: Limits,
    /// Defaults of `create`.
    pub defaults: CreateDefaults,
    /// Bytes of console log kept per file (two files).
    pub console_log_cap_bytes: u64,
    /// The agent's vsock port.
    pub agent_vsock_port: u32,
    /// Exit status `exec`/`run` use when microagent itself failed.
    pub exec_failure_exit_code: u8,
}

/// One state.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct StateEntry {
    /// The state.
    pub state: State,
    /// Whether a VMM process runs in it.
    pub has_vmm: bool,
}

/// Defaults of `create`.
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct CreateDefaults {
    /// Image name.
    pub image: &'static str,
    /// vCPUs.
    pub vcpus: u8,
    /// Guest memory, MiB.
    pub mem_mib: u64,
    /// Writable disk, MiB.
    pub disk_mib: u64,
}

/// Exit status of `exec`/`run` when microagent failed before the command
/// could report one (as `docker run` does).
pub const EXEC_FAILURE_EXIT_CODE: u8 = 125;

/// The contract of this build.
pub fn contract() -> Contract {
    let transitions = State::ALL
        .iter()
        .flat_map(|&a| State::ALL.iter().map(move |&b| (a, b)))
        .filter(|(a, b)| a.can_become(*b))
        .collect();
    Contract {
        contract_version: 1,
        microagent_version: env!("CARGO_PKG_VERSION"),
        agent_protocol_version: guest_agent::protocol::PROTOCOL_VERSION,
        states: State::ALL
            .iter()
            .map(|&s| StateEntry {
                state: s,
                has_vmm: s.has_vmm(),
            })
            .collect(),
        transitions,
        error_codes: ErrorCode::ALL.to_vec(),
        limits: LIMITS,
        defaults: CreateDefaults {
            image: defaults::IMAGE,
            vcpus: defaults::VCPUS,
            mem_mib: defaults::MEM_MIB,
            disk_mib: defaults::DISK_MIB,
        },
        console_log_cap_bytes: CONSOLE_LOG_CAP,
        agent_vsock_port: AGENT_PORT,
        exec_failure_exit_code: EXEC_FAILURE_EXIT_CODE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_lists_every_state_and_code() {
        let json = serde_json::to_value(contract()).unwrap();
        assert_eq!(json["states"].as_array().unwrap().len(), State::ALL.len());
        assert_eq!(json["error_codes"].as_array().unwrap().len(), 8);
        assert!(json["transitions"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(["running", "stopping"])));
        assert_eq!(json["limits"]["max_vcpus"], 8);
    }
}
