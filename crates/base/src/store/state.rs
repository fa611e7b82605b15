//! The workspace state machine. Only the transitions listed here are legal;
//! everything else is a CONFLICT the front ends report with the state.

use serde::{Deserialize, Serialize};

/// Where a workspace is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Defined on disk, never started or cleanly stopped.
    Stopped,
    /// Its VMM process is booting the guest.
    Starting,
    /// The guest agent answers.
    Running,
    /// A stop was requested and is in progress.
    Stopping,
    /// Its VMM process died without being asked to (kill -9, crash, guest panic).
    Crashed,
    /// Its whole machine is written into its directory and its VMM is
    /// gone; the next call (or `start`, `resume`) restores it as it was.
    Hibernated,
}

impl State {
    /// Every state, for `contract` output and tests.
    pub const ALL: [State; 6] = [
        State::Stopped,
        State::Starting,
        State::Running,
        State::Stopping,
        State::Crashed,
        State::Hibernated,
    ];

    /// Stable lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Stopped => "stopped",
            State::Starting => "starting",
            State::Running => "running",
            State::Stopping => "stopping",
            State::Crashed => "crashed",
            State::Hibernated => "hibernated",
        }
    }

    /// Whether a VMM process is expected to exist in this state.
    pub fn has_vmm(self) -> bool {
        matches!(self, State::Starting | State::Running | State::Stopping)
    }

    /// Whether it holds a machine's running state: a VMM, or a hibernated
    /// machine (processes, memory, the volumes' page cache) that a delete
    /// or a restore over it would discard.
    pub fn has_machine(self) -> bool {
        self.has_vmm() || self == State::Hibernated
    }

    /// Whether moving to `next` is legal.
    pub fn can_become(self, next: State) -> bool {
        use State::*;
        matches!(
            (self, next),
            (Stopped | Crashed | Hibernated, Starting)
                | (Starting, Running | Stopping | Crashed)
                | (Running, Stopping | Crashed | Hibernated)
                | (Stopping, Stopped | Crashed)
                | (Hibernated, Stopped)
        )
    }

    /// Moves to `next`, or says why not.
    pub fn become_(self, next: State) -> Result<State, TransitionError> {
        if self.can_become(next) {
            Ok(next)
        } else {
            Err(TransitionError {
                from: self,
                to: next,
            })
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An illegal state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a {from} workspace cannot become {to}")]
pub struct TransitionError {
    /// Current state.
    pub from: State,
    /// Requested state.
    pub to: State,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_normal_life_cycle_is_legal() {
        let mut s = State::Stopped;
        for next in [
            State::Starting,
            State::Running,
            State::Stopping,
            State::Stopped,
            State::Starting,
        ] {
            s = s.become_(next).unwrap();
        }
        assert_eq!(s, State::Starting);
    }

    #[test]
    fn a_running_workspace_hibernates_and_comes_back_or_is_stopped() {
        assert!(State::Running.can_become(State::Hibernated));
        assert!(State::Hibernated.can_become(State::Starting));
        assert!(State::Hibernated.can_become(State::Stopped));
        assert!(!State::Hibernated.can_become(State::Running));
        assert!(!State::Stopped.can_become(State::Hibernated));
        assert!(!State::Hibernated.has_vmm());
        assert!(State::Hibernated.has_machine() && State::Running.has_machine());
        assert!(!State::Stopped.has_machine() && !State::Crashed.has_machine());
    }

    #[test]
    fn crashes_and_restarts() {
        assert!(State::Running.can_become(State::Crashed));
        assert!(State::Starting.can_become(State::Crashed));
        assert!(State::Crashed.can_become(State::Starting));
        assert!(!State::Crashed.can_become(State::Running));
    }

    #[test]
    fn illegal_moves_are_refused() {
        for (from, to) in [
            (State::Stopped, State::Running),
            (State::Stopped, State::Stopping),
            (State::Running, State::Starting),
            (State::Running, State::Stopped),
            (State::Stopping, State::Running),
        ] {
            let err = from.become_(to).unwrap_err();
            assert_eq!((err.from, err.to), (from, to));
            assert!(err.to_string().contains(from.as_str()));
        }
        for s in State::ALL {
            assert!(!s.can_become(s), "{s} -> {s}");
        }
    }

    #[test]
    fn serde_names_are_the_stable_names() {
        for s in State::ALL {
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        assert!(State::Running.has_vmm() && !State::Stopped.has_vmm() && !State::Crashed.has_vmm());
    }
}
