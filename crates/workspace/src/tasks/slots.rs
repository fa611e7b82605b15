//! Task slots: at most N tasks run at once. Each repository prefers one
//! slot (by a hash of its alias), so its next task finds the caches its
//! last one left: a task mounts the cache volume of its agent, its
//! repository and its slot ([`cache_volume`]) at `base::volumes::CACHE_MOUNT`, which
//! the guest's `~/.cache` points into. The volume is its agent's (a task
//! the host started: nobody's), so no other agent mounts, reads or plants
//! anything in what the next task of that agent runs.

use serde::Serialize;
use sha2::{Digest, Sha256};

use base::volumes::CACHE_PREFIX;

/// Most slots, whatever the budget says.
pub const MAX_SLOTS: u32 = 16;
/// Size of a slot's cache volume, MiB (sparse).
pub const CACHE_SIZE_MIB: u64 = 8 * 1024;
/// Hex digits of the key in a cache volume's name.
const CACHE_KEY_HEX: usize = 16;

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
    /// The task cache volumes the caller may use, by name.
    pub caches: Vec<TaskCache>,
}

/// A task cache volume: whose, for which repository, in which slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct TaskCache {
    /// The volume.
    pub volume: String,
    /// The slot whose tasks mount it.
    pub slot: u32,
    /// The agent that owns it (none: tasks the host started).
    pub agent: Option<String>,
    /// The repository whose tasks mount it (none: a repository no longer
    /// allowlisted, or an unused cache of an older version).
    pub repo: Option<String>,
    /// Its size, MiB (sparse).
    pub size_mib: u64,
    /// Host bytes it takes.
    pub used_bytes: u64,
    /// A `task-cache-<slot>` volume of a version before caches had owners:
    /// no task mounts it any more; remove it (`volume rm`) when its
    /// contents are not wanted.
    pub legacy: bool,
}

impl TaskCache {
    /// One line for a person: the volume, its slot, whose and for what.
    pub fn line(&self) -> String {
        let whose = match &self.agent {
            Some(agent) => format!("agent {agent}"),
            None => "no agent (the host's tasks)".to_owned(),
        };
        let what = match (&self.repo, self.legacy) {
            (_, true) => "unused since caches have owners (`volume rm` it when not wanted)".into(),
            (Some(repo), false) => format!("repository {repo}"),
            (None, false) => "a repository no longer allowlisted".into(),
        };
        format!(
            "cache {}: slot {}, {whose}, {what}, {} MiB used",
            self.volume,
            self.slot,
            self.used_bytes >> 20
        )
    }
}

/// The key of `agent`'s caches for `repo` (none: the host's tasks): hex of
/// a SHA-256 over both, so names of any length fit a volume name and no
/// two owners or repositories share one.
pub fn cache_key(agent: Option<&str>, repo: &str) -> String {
    let mut hash = Sha256::new();
    match agent {
        Some(agent) => hash.update(format!("agent\0{agent}\0{repo}")),
        None => hash.update(format!("host\0{repo}")),
    }
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    hex[..CACHE_KEY_HEX].to_owned()
}

/// The cache volume of `agent`'s tasks on `repo` in `slot` (none: the
/// host's): `task-cache-<key>-<slot>`.
pub fn cache_volume(agent: Option<&str>, repo: &str, slot: u32) -> String {
    format!("{CACHE_PREFIX}{}-{slot}", cache_key(agent, repo))
}

/// The key and slot a cache volume's short name carries (no key: an older
/// version's `task-cache-<slot>`); `None` for any other volume.
pub fn parse_cache_volume(name: &str) -> Option<(Option<&str>, u32)> {
    let rest = name.strip_prefix(CACHE_PREFIX)?;
    match rest.split_once('-') {
        None => Some((None, rest.parse().ok()?)),
        Some((key, slot)) => {
            let hex = key.len() == CACHE_KEY_HEX
                && key
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            hex.then_some(())?;
            Some((Some(key), slot.parse().ok()?))
        }
    }
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
    }

    #[test]
    fn caches_are_keyed_by_agent_repository_and_slot() {
        let mine = cache_volume(Some("alice"), "proj", 3);
        base::store::name::validate_name(&mine).unwrap();
        assert!(
            mine.starts_with(CACHE_PREFIX) && mine.ends_with("-3"),
            "{mine}"
        );
        let key = cache_key(Some("alice"), "proj");
        assert_eq!(parse_cache_volume(&mine), Some((Some(key.as_str()), 3)));
        let others = [
            cache_volume(Some("bob"), "proj", 3),
            cache_volume(None, "proj", 3),
            cache_volume(Some("alice"), "other", 3),
            cache_volume(Some("alice"), "proj", 4),
            // The separator keeps agent and alias apart.
            cache_volume(Some("alice-proj"), "", 3),
        ];
        for other in &others {
            assert_ne!(&mine, other);
        }
        // Names of any length still make a valid volume name.
        let long = "a".repeat(base::store::name::MAX_NAME_LEN);
        base::store::name::validate_name(&cache_volume(Some(&long), &long, MAX_SLOTS)).unwrap();
        assert_eq!(parse_cache_volume("task-cache-7"), Some((None, 7)));
        for not_a_cache in ["data", "task-cache-", "task-cache-x-1", "task-cache-7x"] {
            assert_eq!(parse_cache_volume(not_a_cache), None, "{not_a_cache}");
        }
    }

    #[test]
    fn default_slots_follow_memory() {
        assert_eq!(default_max_slots(8192, 1024), 4);
        assert_eq!(default_max_slots(512, 1024), 1);
        assert_eq!(default_max_slots(1 << 30, 1), MAX_SLOTS);
    }
}
