//! Exec ids: the running execs (for `signal` and `result`) and the results
//! of finished ones, kept for [`RESULT_TTL`], at most [`MAX_RESULTS`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use base64::Engine as _;
use guest_agent::protocol::{
    AgentErrorCode, ExecExit, Response, MAX_EXEC_ID, MAX_RESULTS, RESULT_TTL,
};

/// Why an exec id could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ProcessTableError {
    /// The id is empty, too long or has characters outside `[A-Za-z0-9._:-]`.
    #[error("exec id {0:?} must be 1-128 characters of A-Z a-z 0-9 . _ : -")]
    BadId(String),
    /// An exec with this id is running.
    #[error("exec {0:?} is already running")]
    Running(String),
}

impl ProcessTableError {
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::BadId(_) => AgentErrorCode::InvalidInput,
            Self::Running(_) => AgentErrorCode::Exists,
        }
    }
}

#[derive(Debug)]
struct Done {
    at: Instant,
    exited: ExecExit,
    stdout_head: Vec<u8>,
    stderr_head: Vec<u8>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Exec id to pid (0 while spawning).
    running: HashMap<String, u32>,
    done: HashMap<String, Done>,
    /// Finished ids, oldest first (may hold ids replaced since).
    order: VecDeque<(String, Instant)>,
    next_id: u64,
}

impl Inner {
    fn prune(&mut self, now: Instant) {
        while let Some((id, at)) = self.order.front() {
            // A slot whose id was reused since is stale: just pop it.
            let live = self.done.get(id).is_some_and(|d| d.at == *at);
            let expired = now.duration_since(*at) > RESULT_TTL;
            if live && !expired && self.done.len() <= MAX_RESULTS {
                break;
            }
            if live {
                self.done.remove(id);
            }
            self.order.pop_front();
        }
    }
}

/// True for 1-128 characters of `[A-Za-z0-9._:-]` (exec and process ids).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_EXEC_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// What is known about an exec id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Running with this pid (0: being spawned).
    Running(u32),
    /// Finished, result kept.
    Finished,
    /// Never seen, or its result expired.
    Unknown,
}

/// The exec registry.
#[derive(Debug, Default)]
pub struct ProcessTable {
    inner: Mutex<Inner>,
}

impl ProcessTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `requested` (or a fresh id) for a new exec.
    pub fn reserve(&self, requested: Option<String>) -> Result<String, ProcessTableError> {
        let mut inner = self.lock();
        let id = match requested {
            Some(id) => {
                if !valid_id(&id) {
                    return Err(ProcessTableError::BadId(id));
                }
                if inner.running.contains_key(&id) {
                    return Err(ProcessTableError::Running(id));
                }
                id
            }
            None => loop {
                inner.next_id += 1;
                let id = format!("exec-{}", inner.next_id);
                if !inner.running.contains_key(&id) && !inner.done.contains_key(&id) {
                    break id;
                }
            },
        };
        inner.running.insert(id.clone(), 0);
        Ok(id)
    }

    /// Records the pid of a spawned exec.
    pub fn set_pid(&self, id: &str, pid: u32) {
        if let Some(p) = self.lock().running.get_mut(id) {
            *p = pid;
        }
    }

    /// Forgets an exec that failed to spawn.
    pub fn release(&self, id: &str) {
        self.lock().running.remove(id);
    }

    /// Moves an exec from running to finished (replacing an older result
    /// with the same id).
    pub fn finish(&self, exited: ExecExit, stdout_head: Vec<u8>, stderr_head: Vec<u8>) {
        let now = Instant::now();
        let mut inner = self.lock();
        let id = exited.exec_id.clone();
        inner.running.remove(&id);
        inner.order.push_back((id.clone(), now));
        inner.done.insert(
            id,
            Done {
                at: now,
                exited,
                stdout_head,
                stderr_head,
            },
        );
        inner.prune(now);
    }

    /// The state of `id`.
    pub fn lookup(&self, id: &str) -> Lookup {
        let mut inner = self.lock();
        inner.prune(Instant::now());
        if let Some(pid) = inner.running.get(id) {
            Lookup::Running(*pid)
        } else if inner.done.contains_key(id) {
            Lookup::Finished
        } else {
            Lookup::Unknown
        }
    }

    /// The answer to `result`: `running`, `exited` with the output heads,
    /// or `None` when unknown.
    pub fn result(&self, id: &str) -> Option<Response> {
        let mut inner = self.lock();
        inner.prune(Instant::now());
        if let Some(pid) = inner.running.get(id) {
            return Some(Response::Running {
                exec_id: id.to_owned(),
                pid: *pid,
            });
        }
        let done = inner.done.get(id)?;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut exited = done.exited.clone();
        exited.stdout_head = Some(b64.encode(&done.stdout_head));
        exited.stderr_head = Some(b64.encode(&done.stderr_head));
        Some(Response::Exited(exited))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(reg: &ProcessTable, id: &str) {
        let exited = ExecExit {
            exec_id: id.into(),
            ..ExecExit::default()
        };
        reg.finish(exited, b"out".to_vec(), Vec::new());
    }

    #[test]
    fn ids_are_unique_while_running_and_results_are_bounded() {
        let reg = ProcessTable::default();
        let a = reg.reserve(None).unwrap();
        assert!(matches!(
            reg.reserve(Some(a.clone())),
            Err(ProcessTableError::Running(_))
        ));
        assert!(matches!(
            reg.reserve(Some("bad id".into())),
            Err(ProcessTableError::BadId(_))
        ));
        reg.set_pid(&a, 42);
        assert_eq!(reg.lookup(&a), Lookup::Running(42));
        finished(&reg, &a);
        assert_eq!(reg.lookup(&a), Lookup::Finished);
        let Some(Response::Exited(e)) = reg.result(&a) else {
            panic!("no result")
        };
        assert_eq!(e.stdout_head_bytes().unwrap(), b"out");

        for i in 0..MAX_RESULTS + 10 {
            let id = format!("r{i}");
            reg.reserve(Some(id.clone())).unwrap();
            finished(&reg, &id);
        }
        assert_eq!(reg.lookup(&a), Lookup::Unknown);
        assert_eq!(reg.lookup("r0"), Lookup::Unknown);
        assert_eq!(
            reg.lookup(&format!("r{}", MAX_RESULTS + 9)),
            Lookup::Finished
        );
        assert_eq!(reg.lock().done.len(), MAX_RESULTS);
    }
}
