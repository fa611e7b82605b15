//! Conversions take turns: at most [`CONVERSIONS_AT_ONCE`] in one process
//! (the MCP server's clients share them), since each holds a scratch tree
//! of up to the image byte limit and a thread's worth of inflating. A pull
//! converting as it downloads and a pulled image converted at its first
//! use wait alike.

use std::sync::{Condvar, Mutex};

/// Conversions one process runs at once.
pub const CONVERSIONS_AT_ONCE: usize = 4;

/// Turns in use, and the signal that one was given back.
struct Turns {
    used: Mutex<usize>,
    freed: Condvar,
}

static TURNS: Turns = Turns {
    used: Mutex::new(0),
    freed: Condvar::new(),
};

/// A conversion's turn, given back when dropped.
pub(super) struct Turn(());

impl Turn {
    /// Waits for a turn.
    pub(super) fn take() -> Turn {
        let mut used = TURNS.used.lock().unwrap_or_else(|p| p.into_inner());
        while *used >= CONVERSIONS_AT_ONCE {
            used = TURNS.freed.wait(used).unwrap_or_else(|p| p.into_inner());
        }
        *used += 1;
        Turn(())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut used = TURNS.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(1);
        TURNS.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_more_than_the_limit_convert_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NOW: AtomicUsize = AtomicUsize::new(0);
        static MOST: AtomicUsize = AtomicUsize::new(0);
        let threads: Vec<_> = (0..3 * CONVERSIONS_AT_ONCE)
            .map(|_| {
                std::thread::spawn(|| {
                    let _turn = Turn::take();
                    let now = NOW.fetch_add(1, Ordering::SeqCst) + 1;
                    MOST.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    NOW.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let most = MOST.load(Ordering::SeqCst);
        assert!(most <= CONVERSIONS_AT_ONCE && most > 1, "{most} at once");
    }
}
