//! The host-wide budget: how many workspaces may run at once, how much
//! guest memory they may take together, and the free disk below which new
//! workspaces are refused, so that many workspaces cannot take the host
//! down. Set in `<state>/budget.json` (every field optional):
//!
//! ```json
//! {"max_running": 8, "max_guest_mem_mib": 16384, "min_free_disk_mib": 2048}
//! ```
//!
//! Checked at create (disk) and at start (all three) under one lock, so
//! two starts at once cannot both take the last place.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The budget file in the state directory.
pub const BUDGET_FILE: &str = "budget.json";
/// The lock starts take while they check and claim their place.
const LOCK_FILE: &str = "budget.lock";
/// The free-disk floor when the file names none: a workspace's writable
/// disk is sparse and grows as the guest writes.
pub const DEFAULT_MIN_FREE_DISK_MIB: u64 = 512;

/// The budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HostBudget {
    /// Most workspaces running (or starting) at once; none: no limit.
    #[serde(default)]
    pub max_running: Option<u32>,
    /// Most guest memory of the running workspaces together, MiB.
    #[serde(default)]
    pub max_guest_mem_mib: Option<u64>,
    /// Create and start are refused below this much free disk, MiB.
    #[serde(default = "default_floor")]
    pub min_free_disk_mib: u64,
}

fn default_floor() -> u64 {
    DEFAULT_MIN_FREE_DISK_MIB
}

impl Default for HostBudget {
    fn default() -> Self {
        Self {
            max_running: None,
            max_guest_mem_mib: None,
            min_free_disk_mib: DEFAULT_MIN_FREE_DISK_MIB,
        }
    }
}

/// Why the budget refused, or could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    /// As many workspaces run as the budget allows.
    #[error("{running} workspaces are running, the most the host budget allows ({max})")]
    Running {
        /// Running now.
        running: u32,
        /// The budget.
        max: u32,
    },
    /// The guest memory would pass the budget.
    #[error(
        "starting it would make {total} MiB of guest memory, past the host budget of {max} MiB"
    )]
    Memory {
        /// Running plus this workspace, MiB.
        total: u64,
        /// The budget.
        max: u64,
    },
    /// The disk is fuller than the floor allows.
    #[error("only {free} MiB free on the state directory's disk, below the host budget's floor of {floor} MiB")]
    Disk {
        /// Free, MiB.
        free: u64,
        /// The floor.
        floor: u64,
    },
    /// The budget file is not valid.
    #[error("the host budget {} is not valid", path.display())]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        #[source]
        source: serde_json::Error,
    },
    /// The budget file or the lock could not be read or taken.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl BudgetError {
    /// The stable code front ends report.
    pub fn code(&self) -> base::code::ErrorCode {
        match self {
            Self::Running { .. } | Self::Memory { .. } | Self::Disk { .. } => {
                base::code::ErrorCode::Conflict
            }
            Self::File { .. } => base::code::ErrorCode::InvalidInput,
            Self::Io { .. } => base::code::ErrorCode::Internal,
        }
    }
}

impl HostBudget {
    /// The budget of the state directory at `root` (the defaults when it
    /// has no budget file).
    pub fn load(root: &Path) -> Result<Self, BudgetError> {
        let path = root.join(BUDGET_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes).map_err(|source| BudgetError::File { path, source })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(BudgetError::Io {
                what: format!("reading {}", path.display()),
                source,
            }),
        }
    }

    /// Refuses when `free_mib` is below the floor.
    pub fn check_disk(&self, free_mib: u64) -> Result<(), BudgetError> {
        if free_mib < self.min_free_disk_mib {
            return Err(BudgetError::Disk {
                free: free_mib,
                floor: self.min_free_disk_mib,
            });
        }
        Ok(())
    }

    /// Refuses a start of a workspace of `mem_mib` beside `others` (every
    /// other workspace).
    pub fn check_start(&self, others: &[Occupant], mem_mib: u64) -> Result<(), BudgetError> {
        let live: Vec<&Occupant> = others.iter().filter(|o| o.has_vmm).collect();
        let running = u32::try_from(live.len()).unwrap_or(u32::MAX);
        if let Some(max) = self.max_running {
            if running >= max {
                return Err(BudgetError::Running { running, max });
            }
        }
        if let Some(max) = self.max_guest_mem_mib {
            let total = live
                .iter()
                .map(|o| o.mem_mib)
                .fold(mem_mib, u64::saturating_add);
            if total > max {
                return Err(BudgetError::Memory { total, max });
            }
        }
        Ok(())
    }
}

/// Another workspace, as a start's budget check sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupant {
    /// It has a VMM process (it counts as running and holds its memory).
    pub has_vmm: bool,
    /// Its guest memory, MiB.
    pub mem_mib: u64,
}

/// Holds the budget lock of a state directory while a start checks and
/// claims its place (released when dropped).
#[derive(Debug)]
pub(crate) struct BudgetLock(#[allow(dead_code)] std::fs::File);

impl BudgetLock {
    pub(crate) fn take(root: &Path) -> Result<Self, BudgetError> {
        let path = root.join(LOCK_FILE);
        let io = |what: &str| {
            let what = format!("{what} {}", path.display());
            move |source| BudgetError::Io { what, source }
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io("opening"))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this function owns; it blocks until
        // the lock is ours and is released when the file closes.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io("locking")(std::io::Error::last_os_error()));
        }
        Ok(Self(file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_the_defaults_and_a_bad_one_an_error() {
        let dir =
            std::env::temp_dir().join(format!("ma-budget-{}", base::host::settings::unique_id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(HostBudget::load(&dir).unwrap(), HostBudget::default());
        std::fs::write(dir.join(BUDGET_FILE), r#"{"max_running": 2}"#).unwrap();
        let b = HostBudget::load(&dir).unwrap();
        assert_eq!(b.max_running, Some(2));
        assert_eq!(b.min_free_disk_mib, DEFAULT_MIN_FREE_DISK_MIB);
        std::fs::write(dir.join(BUDGET_FILE), r#"{"max_runing": 2}"#).unwrap();
        let err = HostBudget::load(&dir).unwrap_err();
        assert_eq!(err.code(), base::code::ErrorCode::InvalidInput, "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    fn occupant(_name: &str, state: base::store::state::State, mem_mib: u64) -> Occupant {
        Occupant {
            has_vmm: state.has_vmm(),
            mem_mib,
        }
    }

    #[test]
    fn starts_are_refused_past_the_running_and_memory_budgets() {
        use base::store::state::State;
        let others = [
            occupant("a", State::Running, 512),
            occupant("b", State::Starting, 256),
            occupant("c", State::Stopped, 4096),
        ];
        HostBudget::default().check_start(&others, 1 << 20).unwrap();
        let two = HostBudget {
            max_running: Some(2),
            ..HostBudget::default()
        };
        let err = two.check_start(&others, 64).unwrap_err();
        assert!(
            matches!(err, BudgetError::Running { running: 2, max: 2 }),
            "{err}"
        );
        let three = HostBudget {
            max_running: Some(3),
            max_guest_mem_mib: Some(1024),
            ..HostBudget::default()
        };
        // Stopped workspaces take no memory: 512 + 256 + 256 fits.
        three.check_start(&others, 256).unwrap();
        let err = three.check_start(&others, 257).unwrap_err();
        assert!(
            matches!(
                err,
                BudgetError::Memory {
                    total: 1025,
                    max: 1024
                }
            ),
            "{err}"
        );
        assert_eq!(err.code(), base::code::ErrorCode::Conflict);
    }

    #[test]
    fn the_disk_floor_refuses_below_it() {
        let b = HostBudget::default();
        b.check_disk(DEFAULT_MIN_FREE_DISK_MIB).unwrap();
        let err = b.check_disk(DEFAULT_MIN_FREE_DISK_MIB - 1).unwrap_err();
        assert!(err.to_string().contains("below the host budget"), "{err}");
        assert_eq!(err.code(), base::code::ErrorCode::Conflict);
    }
}
