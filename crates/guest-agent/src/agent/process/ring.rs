//! A bounded output ring addressed by absolute byte offsets: a background
//! process's stream keeps its newest `cap` bytes, and a reader asks from a
//! cursor (bytes since the stream began), learning how many it missed.

use std::collections::VecDeque;

/// The newest `cap` bytes of a stream.
#[derive(Debug)]
pub struct Ring {
    cap: usize,
    data: VecDeque<u8>,
    /// Bytes ever pushed; `data` holds the last `data.len()` of them.
    total: u64,
}

/// What [`Ring::read`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Read {
    /// Offset of `bytes[0]`.
    pub cursor: u64,
    pub bytes: Vec<u8>,
    /// Bytes between the asked cursor and `cursor` that were overwritten.
    pub dropped: u64,
}

impl Ring {
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            data: VecDeque::new(),
            total: 0,
        }
    }

    /// Appends `bytes`, dropping the oldest beyond the cap.
    pub fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let keep = bytes.len().min(self.cap);
        let overflow = (self.data.len() + keep).saturating_sub(self.cap);
        self.data.drain(..overflow);
        self.data.extend(&bytes[bytes.len() - keep..]);
    }

    /// Bytes ever pushed.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Offset of the oldest byte kept.
    fn start(&self) -> u64 {
        self.total - self.data.len() as u64
    }

    /// Up to `max` bytes from `cursor` (a cursor past the end reads nothing
    /// from the end).
    pub fn read(&self, cursor: u64, max: usize) -> Read {
        let start = self.start();
        let from = cursor.clamp(start, self.total);
        let skip = (from - start) as usize;
        let n = (self.data.len() - skip).min(max);
        Read {
            cursor: from,
            bytes: self.data.range(skip..skip + n).copied().collect(),
            dropped: from.saturating_sub(cursor.min(self.total)),
        }
    }

    /// True when there is something to read from `cursor`.
    pub fn has_after(&self, cursor: u64) -> bool {
        cursor < self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_bytes_and_counts_what_a_reader_missed() {
        let mut ring = Ring::new(4);
        ring.push(b"ab");
        assert_eq!(
            ring.read(0, 10),
            Read {
                cursor: 0,
                bytes: b"ab".to_vec(),
                dropped: 0
            }
        );
        ring.push(b"cdef");
        assert_eq!(ring.total(), 6);
        let r = ring.read(0, 10);
        assert_eq!(
            (r.cursor, r.bytes.as_slice(), r.dropped),
            (2, &b"cdef"[..], 2)
        );
        let r = ring.read(3, 2);
        assert_eq!(
            (r.cursor, r.bytes.as_slice(), r.dropped),
            (3, &b"de"[..], 0)
        );
        let r = ring.read(99, 10);
        assert_eq!((r.cursor, r.bytes.len(), r.dropped), (6, 0, 0));
        assert!(!ring.has_after(6));
        assert!(ring.has_after(5));
        // A push larger than the ring keeps its tail.
        ring.push(b"0123456789");
        let r = ring.read(6, 100);
        assert_eq!(
            (r.cursor, r.bytes.as_slice(), r.dropped),
            (12, &b"6789"[..], 6)
        );
    }

    #[test]
    fn a_zero_sized_ring_only_counts() {
        let mut ring = Ring::new(0);
        ring.push(b"abc");
        let r = ring.read(0, 10);
        assert_eq!((r.cursor, r.bytes.len(), r.dropped), (3, 0, 3));
    }
}
