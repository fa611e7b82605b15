//! A workspace's event log: append-only JSON lines in `events.jsonl`, each
//! with a sequence number, so a caller can read from a cursor and wait for
//! the next event. Appends take the file's own lock, so two processes never
//! interleave or reuse a number.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file name inside a workspace directory.
pub const EVENTS_FILE: &str = "events.jsonl";

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// The workspace was created.
    Created,
    /// Its VM started and the agent answered.
    Started {
        /// Booted (cold), or restored from a warm snapshot or a snapshot.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start: Option<crate::store::spec::StartKind>,
        /// Milliseconds from the VMM process's launch to the agent answering.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ready_ms: Option<u64>,
    },
    /// A command started in it.
    ExecStarted {
        /// The agent's exec id.
        exec_id: String,
        /// What ran (argv joined, or the shell line).
        command: String,
    },
    /// A command finished.
    ExecFinished {
        /// The agent's exec id.
        exec_id: String,
        /// Exit code, if it exited.
        code: Option<i32>,
        /// Signal, if it was killed.
        signal: Option<i32>,
    },
    /// A background process started in it.
    ProcessStarted {
        /// The process id.
        id: String,
        /// What runs (argv joined, or the shell line).
        command: String,
    },
    /// It was stopped on request.
    Stopped,
    /// Its VMM died unasked.
    Crashed {
        /// What is known about why.
        reason: String,
    },
    /// Its time to live ran out and it was stopped.
    TtlExpired,
    /// A snapshot of it was taken.
    SnapshotTaken {
        /// The snapshot.
        snapshot: String,
        /// Whether it holds the guest's memory.
        has_memory: bool,
    },
    /// A snapshot of it was deleted.
    SnapshotDeleted {
        /// The snapshot.
        snapshot: String,
    },
    /// Its image's warm snapshot could not be used; it booted instead and
    /// kept a new one.
    WarmSnapshotDiscarded {
        /// Why.
        reason: String,
    },
    /// It was put back to a snapshot's state.
    Restored {
        /// The snapshot.
        snapshot: String,
    },
    /// Its egress policy refused a connection or a DNS question (at most
    /// the last 32 in any second are recorded).
    EgressRefused {
        /// Where it went and why it was refused (its own object: its
        /// `at_ms` is the refusal's, not the record's).
        refusal: crate::store::egress::EgressDenial,
    },
    /// An image's pool of ready workspaces gave members back: their image
    /// or kernel changed, or the host needed their memory (in the pool's
    /// own log, `pool events`).
    PoolDrained {
        /// The image.
        image: String,
        /// How many members went.
        members: usize,
        /// Why.
        reason: String,
    },
    /// Its vCPUs stopped: it sat idle past its `idle_pause`, or was paused
    /// on request. Nothing in it runs until it is resumed.
    Paused {
        /// Why.
        cause: crate::store::spec::PauseCause,
    },
    /// It ran again after a pause.
    Resumed {
        /// What woke it: `a call` (a connection to its agent or a published
        /// port), `request` (`resume`).
        by: String,
        /// How long it was paused, ms.
        paused_ms: u64,
    },
    /// Its machine was written into its directory and its VMM ended.
    Hibernated {
        /// What hibernated it: `request` (`hibernate`) or `idle`.
        by: String,
        /// Bytes of guest memory written (the rest are holes).
        memory_bytes: u64,
        /// From the request to the files written, ms.
        took_ms: u64,
    },
    /// It was created as a fork.
    Forked {
        /// The workspace it was forked from.
        from: String,
        /// The snapshot it was forked from, if not the live workspace.
        snapshot: Option<String>,
    },
}

/// One logged event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Event<K = EventKind> {
    /// 1, 2, 3, ... in order of appending.
    pub seq: u64,
    /// Unix time in milliseconds.
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: K,
}

/// Why the log could not be used.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// The file could not be opened, locked, read or written.
    #[error("event log {} is not usable", path.display())]
    Io {
        /// The log file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// The event log of one workspace, or another numbered log of records
/// `K` (the browser's, `crate::browser`).
#[derive(Clone, Debug)]
pub struct EventLog<K = EventKind> {
    path: PathBuf,
    kind: std::marker::PhantomData<fn() -> K>,
}

impl EventLog {
    /// The log in workspace directory `dir` (created on first append).
    pub fn new(dir: &Path) -> Self {
        Self::at(dir.join(EVENTS_FILE))
    }
}

impl<K: Serialize + serde::de::DeserializeOwned> EventLog<K> {
    /// The log in file `path` (created on first append).
    pub fn at(path: PathBuf) -> Self {
        Self {
            path,
            kind: std::marker::PhantomData,
        }
    }

    fn err(&self) -> impl Fn(std::io::Error) -> EventsError + '_ {
        |source| EventsError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Appends `kind`; returns the event as logged.
    pub fn append(&self, kind: K) -> Result<Event<K>, EventsError> {
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&self.path)
            .map_err(self.err())?;
        // SAFETY: flock on a descriptor we own; released when `file` closes.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(self.err()(std::io::Error::last_os_error()));
        }
        let (last, torn) = last_seq(&mut file).map_err(self.err())?;
        let event = Event {
            seq: last + 1,
            at_ms: crate::host::settings::now_ms(),
            kind,
        };
        // After a torn last line (a crash mid-append), start on a fresh line.
        let mut line = if torn { vec![b'\n'] } else { Vec::new() };
        line.extend(serde_json::to_vec(&event).map_err(|e| self.err()(std::io::Error::other(e)))?);
        line.push(b'\n');
        file.write_all(&line).map_err(self.err())?;
        file.sync_data().map_err(self.err())?;
        Ok(event)
    }

    /// Events with `seq > after`, in order (a missing log has none).
    pub fn read_after(&self, after: u64) -> Result<Vec<Event<K>>, EventsError> {
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.err()(e)),
        };
        let mut out = Vec::new();
        for line in BufReader::new(file).lines() {
            let line = line.map_err(self.err())?;
            // A torn last line (crash mid-append) is skipped, not fatal.
            if let Ok(event) = serde_json::from_str::<Event<K>>(&line) {
                if event.seq > after {
                    out.push(event);
                }
            }
        }
        Ok(out)
    }
}

/// The sequence number of the last complete event in `file`, and whether
/// the file ends without a newline (a torn append).
/// An event line's number, whatever its kind.
#[derive(Deserialize)]
struct Numbered {
    seq: u64,
}

fn last_seq(file: &mut File) -> std::io::Result<(u64, bool)> {
    file.seek(SeekFrom::Start(0))?;
    let mut last = 0;
    let mut torn = false;
    let mut reader = BufReader::new(&mut *file);
    let mut line = String::new();
    while reader.read_line(&mut line)? > 0 {
        torn = !line.ends_with('\n');
        // Only the number: a line of a kind this version does not know
        // (written by a newer one) still takes its place in the order.
        if let Ok(numbered) = serde_json::from_str::<Numbered>(line.trim_end()) {
            last = last.max(numbered.seq);
        }
        line.clear();
    }
    Ok((last, torn))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("microagent-events-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_egress_refusal_reads_back_and_numbers_the_next() {
        let dir = temp_dir("refusal");
        let log = EventLog::new(&dir);
        log.append(EventKind::Created).unwrap();
        let refusal = crate::store::egress::EgressDenial {
            dst: "10.0.2.2".parse().unwrap(),
            port: Some(8001),
            protocol: "tcp".into(),
            name: None,
            reason: "a host address".into(),
            at_ms: 7,
        };
        log.append(EventKind::EgressRefused {
            refusal: refusal.clone(),
        })
        .unwrap();
        assert_eq!(log.append(EventKind::Created).unwrap().seq, 3);
        let read = log.read_after(1).unwrap();
        assert_eq!(read[0].kind, EventKind::EgressRefused { refusal });
        assert_eq!(read.len(), 2);
    }

    #[test]
    fn a_kind_this_version_does_not_know_still_counts() {
        let dir = temp_dir("unknown");
        std::fs::write(
            dir.join(EVENTS_FILE),
            "{\"seq\":4,\"at_ms\":1,\"kind\":\"from_the_future\"}\n",
        )
        .unwrap();
        let log = EventLog::new(&dir);
        assert_eq!(log.append(EventKind::Created).unwrap().seq, 5);
    }

    #[test]
    fn appends_in_order_and_reads_from_a_cursor() {
        let dir = temp_dir("order");
        let log = EventLog::new(&dir);
        assert!(log.read_after(0).unwrap().is_empty());
        log.append(EventKind::Created).unwrap();
        log.append(EventKind::Started {
            start: None,
            ready_ms: None,
        })
        .unwrap();
        let e = log
            .append(EventKind::ExecFinished {
                exec_id: "e1".into(),
                code: Some(0),
                signal: None,
            })
            .unwrap();
        assert_eq!(e.seq, 3);
        let after1: Vec<u64> = log.read_after(1).unwrap().iter().map(|e| e.seq).collect();
        assert_eq!(after1, vec![2, 3]);
        assert_eq!(log.read_after(0).unwrap()[0].kind, EventKind::Created);
        let line = std::fs::read_to_string(dir.join(EVENTS_FILE)).unwrap();
        assert!(line
            .lines()
            .nth(2)
            .unwrap()
            .contains("\"kind\":\"exec_finished\""));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn concurrent_appenders_never_reuse_a_number() {
        let dir = temp_dir("concurrent");
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let log = EventLog::new(&dir);
                std::thread::spawn(move || {
                    for _ in 0..25 {
                        log.append(EventKind::Started {
                            start: None,
                            ready_ms: None,
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let seqs: Vec<u64> = EventLog::new(&dir)
            .read_after(0)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_numbering_goes_on() {
        let dir = temp_dir("torn");
        let log = EventLog::new(&dir);
        log.append(EventKind::Created).unwrap();
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join(EVENTS_FILE))
            .unwrap();
        f.write_all(b"{\"seq\":2,\"at_ms\":1,\"ki").unwrap();
        drop(f);
        assert_eq!(log.read_after(0).unwrap().len(), 1);
        // The next append starts a fresh line after the torn one.
        assert_eq!(log.append(EventKind::Stopped).unwrap().seq, 2);
        let kinds: Vec<EventKind> = log
            .read_after(0)
            .unwrap()
            .into_iter()
            .map(|e| e.kind)
            .collect();
        assert_eq!(kinds, vec![EventKind::Created, EventKind::Stopped]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
