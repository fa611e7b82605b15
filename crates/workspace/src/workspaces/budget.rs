//! The host budget as the collection applies it: read, and checked at
//! create (disk) and start (running workspaces, guest memory, disk).

use crate::error::Result;
use crate::host::budget::{BudgetError, HostBudget, Occupant};
use crate::workspaces::manager::Workspaces;

impl Workspaces {
    /// The host budget of this state directory.
    pub fn host_budget(&self) -> Result<HostBudget> {
        Ok(HostBudget::load(self.state_dir().root())?)
    }

    /// Refuses a create when the disk is below the floor.
    pub(crate) fn check_budget_disk(&self) -> Result<()> {
        self.check_disk_against(&self.host_budget()?)
    }

    fn check_disk_against(&self, budget: &HostBudget) -> Result<()> {
        let root = self.state_dir().root();
        let free = base::host::settings::free_bytes(root).map_err(|source| BudgetError::Io {
            what: format!("measuring the free space of {}", root.display()),
            source,
        })?;
        Ok(budget.check_disk(free >> 20)?)
    }

    /// Refuses a start of `name` (of `mem_mib`) past the budget. The
    /// caller holds the workspace's lock and the budget lock.
    pub(crate) fn check_budget_start(&self, name: &str, mem_mib: u64) -> Result<()> {
        let budget = self.host_budget()?;
        self.check_disk_against(&budget)?;
        loop {
            let refused = match budget.check_start(&self.occupants(name)?, mem_mib) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            // Pool members are given back first; a member's own start
            // takes no other's place.
            let for_member = base::store::name::namespace_of(name) == crate::pool::POOL_NAMESPACE;
            if for_member || !self.pools().give_back_a_member() {
                return Err(refused.into());
            }
        }
    }

    /// What runs or may run beside `name`.
    fn occupants(&self, name: &str) -> Result<Vec<Occupant>> {
        let mut others = Vec::new();
        for other in self.state_dir().list_workspaces()? {
            if other == name {
                continue;
            }
            match self.at(&other).get() {
                Ok(meta) => others.push(Occupant {
                    has_vmm: meta.state.has_vmm(),
                    mem_mib: meta.spec.mem_mib,
                }),
                // Deleted meanwhile, or a damaged record `inspect` names.
                Err(_) => continue,
            }
        }
        Ok(others)
    }
}
