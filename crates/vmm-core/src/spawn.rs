//! Starting a thread that takes ownership of something the machine cannot
//! lose (a vCPU descriptor, the device loop): when the thread cannot be
//! started (`pids.max` reached, memory short), the value comes back, so a
//! failed resume leaves the machine paused and whole rather than gone.

use std::sync::{Arc, Mutex};
use std::thread::{Builder, JoinHandle};

/// A thread that could not be started, and the value it was to own.
#[derive(Debug)]
pub struct NotSpawned<T> {
    /// The value, back.
    pub value: T,
    /// What the OS said.
    pub error: std::io::Error,
}

/// Runs `body(value)` on a new thread from `builder`; gives `value` back
/// when the thread cannot be started.
pub fn spawn_owning<T, R>(
    builder: Builder,
    value: T,
    body: impl FnOnce(T) -> R + Send + 'static,
) -> Result<JoinHandle<R>, NotSpawned<T>>
where
    T: Send + 'static,
    R: Send + 'static,
{
    let slot = Arc::new(Mutex::new(Some(value)));
    let inner = slot.clone();
    let spawned = builder.spawn(move || {
        // Taken here, or by the caller below when the thread never
        // started: never both. The slot is let go before `body`, which may
        // confine the thread (seccomp) before it frees anything else.
        let value = inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(inner);
        body(value.expect("a started thread finds its value"))
    });
    match spawned {
        Ok(handle) => Ok(handle),
        Err(error) => match slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(value) => Err(NotSpawned { value, error }),
            // Unreachable: a thread that did not start took nothing.
            None => unreachable!("a thread that failed to start took its value"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_cannot_start_gives_its_value_back() {
        let ok = spawn_owning(Builder::new(), 41, |v| v + 1).unwrap();
        assert_eq!(ok.join().unwrap(), 42);
        // A stack no allocator can give: the spawn fails, the value stays.
        let huge = Builder::new().stack_size(usize::MAX / 2);
        let failed = spawn_owning(huge, String::from("vcpu fd"), |s| s.len()).unwrap_err();
        assert_eq!(failed.value, "vcpu fd");
    }
}
