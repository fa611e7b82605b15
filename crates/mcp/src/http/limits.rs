//! What bounds the connections of `serve mcp --http` before a request has
//! authenticated: how long a client may take to send its header or finish
//! its TLS handshake, how many connections are open at once, and what the
//! accept loop does when the process runs out of file descriptors.
//!
//! At the limit a new connection closes the oldest one that has not yet
//! sent a request past the gate (token and Host checked), so idle or
//! half-open connections cannot crowd out a client with the token; when
//! every open connection has authenticated, the new one is closed at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How long a client may take to send a request's whole header, counted
/// from when the server starts waiting for it (a new connection, or the
/// end of the previous response on a kept-alive one).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to finish the TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections open at once unless `--max-connections` says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// How long the accept loop waits after accepting failed (say, the process
/// is out of file descriptors) before it tries again.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// The open connections of one server.
#[derive(Debug)]
pub struct Connections {
    max: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    next_id: u64,
    /// By id: oldest first.
    entries: BTreeMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    authenticated: Arc<AtomicBool>,
    close: CancellationToken,
}

/// One admitted connection; it leaves the count when dropped.
#[derive(Debug)]
pub struct Admission {
    id: u64,
    connections: Arc<Connections>,
    authenticated: Arc<AtomicBool>,
    close: CancellationToken,
}

impl Admission {
    /// Marks the connection as having sent a request past the gate: it is
    /// no longer closed to make room.
    pub fn authenticated(&self) -> Arc<AtomicBool> {
        self.authenticated.clone()
    }

    /// Cancelled when the server closes this connection to make room.
    pub fn closed(&self) -> CancellationToken {
        self.close.clone()
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.connections.lock().entries.remove(&self.id);
    }
}

impl Connections {
    /// At most `max` (at least 1) connections.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            open: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        // The map stays consistent whatever panicked while holding it.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Admits a new connection, closing the oldest one that has not
    /// authenticated when the limit is reached; none when every open
    /// connection has authenticated (the new one is then closed).
    pub fn admit(self: &Arc<Self>) -> Option<Admission> {
        let mut open = self.lock();
        if open.entries.len() >= self.max {
            let oldest = open
                .entries
                .iter()
                .find(|(_, e)| !e.authenticated.load(Ordering::Relaxed))
                .map(|(id, _)| *id)?;
            if let Some(entry) = open.entries.remove(&oldest) {
                entry.close.cancel();
            }
        }
        let id = open.next_id;
        open.next_id += 1;
        let (authenticated, close) = (Arc::new(AtomicBool::new(false)), CancellationToken::new());
        open.entries.insert(
            id,
            Entry {
                authenticated: authenticated.clone(),
                close: close.clone(),
            },
        );
        Some(Admission {
            id,
            connections: self.clone(),
            authenticated,
            close,
        })
    }

    /// Closes the older half of the connections that have not
    /// authenticated (at least one when there is one), to give back file
    /// descriptors; how many.
    pub fn shed_unauthenticated(&self) -> usize {
        let mut open = self.lock();
        let waiting: Vec<u64> = open
            .entries
            .iter()
            .filter(|(_, e)| !e.authenticated.load(Ordering::Relaxed))
            .map(|(id, _)| *id)
            .collect();
        let shed = waiting.len().div_ceil(2);
        for id in &waiting[..shed] {
            if let Some(entry) = open.entries.remove(id) {
                entry.close.cancel();
            }
        }
        shed
    }
}

/// Whether an accept error says the process or system ran out of
/// something (file descriptors, memory) rather than that one pending
/// connection went away.
pub fn out_of_resources(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Whether an accept error used up one pending connection (so retrying at
/// once cannot spin).
pub fn one_connection_lost(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted};
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_limit_the_oldest_unauthenticated_goes() {
        let conns = Connections::new(3);
        let a = conns.admit().unwrap();
        let b = conns.admit().unwrap();
        let c = conns.admit().unwrap();
        a.authenticated().store(true, Ordering::Relaxed);
        let d = conns.admit().unwrap();
        assert!(!a.closed().is_cancelled(), "authenticated stays");
        assert!(b.closed().is_cancelled(), "the oldest waiting one goes");
        assert!(!c.closed().is_cancelled());
        assert_eq!(conns.len(), 3);
        drop(b);
        assert_eq!(conns.len(), 3, "an evicted one was already counted out");
        for x in [&c, &d] {
            x.authenticated().store(true, Ordering::Relaxed);
        }
        assert!(
            conns.admit().is_none(),
            "all authenticated: the new one is refused"
        );
        drop(d);
        assert_eq!(conns.len(), 2);
        assert!(conns.admit().is_some());
    }

    #[test]
    fn shedding_closes_the_older_half_of_the_waiting() {
        let conns = Connections::new(100);
        let all: Vec<Admission> = (0..5).map(|_| conns.admit().unwrap()).collect();
        all[0].authenticated().store(true, Ordering::Relaxed);
        assert_eq!(conns.shed_unauthenticated(), 2);
        let closed: Vec<bool> = all.iter().map(|a| a.closed().is_cancelled()).collect();
        assert_eq!(closed, [false, true, true, false, false]);
        assert_eq!(conns.len(), 3);
        assert_eq!(conns.shed_unauthenticated(), 1);
        assert_eq!(conns.shed_unauthenticated(), 1);
        assert_eq!(
            conns.shed_unauthenticated(),
            0,
            "only the authenticated one is left"
        );
        assert_eq!(conns.len(), 1);
    }

    #[test]
    fn accept_errors_are_told_apart() {
        let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
        assert!(out_of_resources(&emfile) && !one_connection_lost(&emfile));
        let aborted = std::io::Error::from_raw_os_error(libc::ECONNABORTED);
        assert!(one_connection_lost(&aborted) && !out_of_resources(&aborted));
    }
}
