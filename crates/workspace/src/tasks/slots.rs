//! Task slots: at most N tasks run at once. Each repository prefers one
//! slot (by a hash of its alias), so its next task finds the caches its
//! last one left: every slot has a cache volume (`task-cache-<slot>`)
//! mounted at [`CACHE_MOUNT`], which the guest's `~/.cache` points into.

use serde::Serialize;

/// Where a slot's cache volume is mounted in a task's guest.
pub const CACHE_MOUNT: &str = "/var/cache/microagent";
/// Most slots, whatever the budget says.
pub const MAX_SLOTS: u32 = 16;
/// Size of a slot's cache volume, MiB (sparse).
pub const CACHE_SIZE_MIB: u64 = 8 * 1024;

/// A slot a task holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct ActiveSlot {
    /// The slot.
    pub slot: u32,
    /// The task in it.
    pub task_id: String,
    /// The task's repository.
    pub repo: String,
}

/// The slots and who holds them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct Slots {
    /// How many tasks may run at once.
    pub max_slots: u32,
    /// Slots held by pending or running tasks.
    pub active: Vec<ActiveSlot>,
    /// Free slots.
    pub available: Vec<u32>,
}

/// The cache volume of `slot`.
pub fn cache_volume(slot: u32) -> String {
    format!("task-cache-{slot}")
}

/// Slots when the configuration names no number: as many tasks of
/// `task_mem_mib` as half of `mem_mib` (the budget's guest memory, else
/// the host's), at least 1 and at most [`MAX_SLOTS`].
pub fn default_max_slots(mem_mib: u64, task_mem_mib: u64) -> u32 {
    let n = (mem_mib / 2) / task_mem_mib.max(1);
    u32::try_from(n).unwrap_or(MAX_SLOTS).clamp(1, MAX_SLOTS)
}

/// The slot `repo` prefers among `max`.
pub fn preferred_slot(repo: &str, max: u32) -> u32 {
    // FNV-1a: stable across builds and runs, unlike the std hasher.
    let hash = repo.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    u32::try_from(hash % u64::from(max.max(1))).unwrap_or(0)
}

/// A free slot for `repo`: its preferred one when free, else the lowest
/// free one.
pub fn choose_slot(repo: &str, max: u32, taken: &[u32]) -> Option<u32> {
    let preferred = preferred_slot(repo, max);
    if !taken.contains(&preferred) {
        return Some(preferred);
    }
    (0..max).find(|s| !taken.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repository_keeps_its_slot_while_it_is_free() {
        let p = preferred_slot("proj", 4);
        assert_eq!(p, preferred_slot("proj", 4));
        assert_eq!(choose_slot("proj", 4, &[]), Some(p));
        let other = choose_slot("proj", 4, &[p]).unwrap();
        assert_ne!(other, p);
        assert_eq!(choose_slot("proj", 2, &[0, 1]), None);
        assert_eq!(cache_volume(3), "task-cache-3");
    }

    #[test]
    fn default_slots_follow_memory() {
        assert_eq!(default_max_slots(8192, 1024), 4);
        assert_eq!(default_max_slots(512, 1024), 1);
        assert_eq!(default_max_slots(1 << 30, 1), MAX_SLOTS);
    }
}
