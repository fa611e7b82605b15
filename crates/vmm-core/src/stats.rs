//! Figures the VMM reports about itself.

use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use crate::memory::GuestMemory;

/// Sums the `Rss:` of every mapping in `smaps` text except those starting at
/// one of `excluded` host addresses.
pub fn rss_excluding(smaps: &str, excluded: &[u64]) -> u64 {
    let mut total = 0;
    let mut skip = false;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((start, _)) = first.split_once('-').filter(|(s, e)| {
            !s.is_empty()
                && s.bytes().all(|b| b.is_ascii_hexdigit())
                && e.bytes().all(|b| b.is_ascii_hexdigit())
        }) {
            skip = u64::from_str_radix(start, 16).is_ok_and(|s| excluded.contains(&s));
        } else if first == "Rss:" && !skip {
            total += fields
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total
}

/// Resident KiB of this process outside guest RAM (None where /proc is unreadable).
pub fn overhead_rss_kib(mem: &GuestMemory) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let guest: Vec<u64> = mem
        .iter()
        .filter_map(|r| r.get_host_address(MemoryRegionAddress(0)).ok())
        .map(|p| p as u64)
        .collect();
    Some(rss_excluding(&smaps, &guest))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0000000-55d0c0100000 r-xp 00000000 08:01 123 /usr/bin/microagent
Size:               1024 kB
Rss:                 800 kB
7f0000000000-7f0004000000 rw-p 00000000 00:00 0
Size:              65536 kB
Rss:               30000 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
Rss:                  40 kB
";

    #[test]
    fn excludes_guest_mappings() {
        assert_eq!(rss_excluding(SMAPS, &[]), 30840);
        assert_eq!(rss_excluding(SMAPS, &[0x7f00_0000_0000]), 840);
    }

    #[test]
    fn reads_own_smaps() {
        let mem = crate::memory::create_guest_memory(16).unwrap();
        assert!(overhead_rss_kib(&mem).unwrap() > 0);
    }
}
