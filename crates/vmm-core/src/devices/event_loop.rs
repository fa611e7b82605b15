//! The device event loop: one thread running an `event_manager` epoll loop
//! over every device's fds (queue ioeventfds, backend sockets, timers).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};

/// A subscriber as the loop holds it.
pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;

/// How long one epoll wait may last before the stop flag is checked again.
const POLL_MS: i32 = 50;

/// Why the loop could not be created or started.
#[derive(Debug, thiserror::Error)]
pub enum EventLoopError {
    /// epoll could not be created.
    #[error("could not create the device event loop")]
    Create(#[source] event_manager::Error),
    /// The thread could not be spawned.
    #[error("could not start the device event loop thread")]
    Spawn(#[source] std::io::Error),
}

/// The loop before it runs: devices are added here (their `init` registers
/// their fds).
pub struct EventLoop {
    manager: EventManager<Subscriber>,
}

impl std::fmt::Debug for EventLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventLoop")
    }
}

impl EventLoop {
    /// An empty loop.
    pub fn new() -> Result<Self, EventLoopError> {
        Ok(Self {
            manager: EventManager::new().map_err(EventLoopError::Create)?,
        })
    }

    /// Adds a device.
    pub fn add(&mut self, subscriber: Subscriber) {
        self.manager.add_subscriber(subscriber);
    }

    /// Runs the loop on its own thread until the returned handle is stopped.
    pub fn spawn(mut self) -> Result<RunningEventLoop, EventLoopError> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let handle = std::thread::Builder::new()
            .name("devices".into())
            .spawn(move || {
                while !thread_stop.load(Ordering::Acquire) {
                    if let Err(e) = self.manager.run_with_timeout(POLL_MS) {
                        tracing::error!("device event loop: {e}");
                        break;
                    }
                }
            })
            .map_err(EventLoopError::Spawn)?;
        Ok(RunningEventLoop {
            stop,
            handle: Some(handle),
        })
    }
}

/// A running loop; dropping it stops and joins the thread.
#[derive(Debug)]
pub struct RunningEventLoop {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl RunningEventLoop {
    /// Stops the loop and waits for its thread (at most one poll interval).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            if h.join().is_err() {
                tracing::error!("device event loop thread panicked");
            }
        }
    }
}

impl Drop for RunningEventLoop {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use event_manager::{EventOps, EventSet, Events};
    use vmm_sys_util::eventfd::EventFd;

    struct Counter {
        evt: EventFd,
        seen: Arc<Mutex<u64>>,
    }

    impl MutEventSubscriber for Counter {
        fn init(&mut self, ops: &mut EventOps) {
            ops.add(Events::new(&self.evt, EventSet::IN)).unwrap();
        }
        fn process(&mut self, _: Events, _: &mut EventOps) {
            *self.seen.lock().unwrap() += self.evt.read().unwrap_or(0);
        }
    }

    #[test]
    fn dispatches_on_its_thread_and_stops() {
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let seen = Arc::new(Mutex::new(0));
        let mut lp = EventLoop::new().unwrap();
        lp.add(Arc::new(Mutex::new(Counter {
            evt: evt.try_clone().unwrap(),
            seen: seen.clone(),
        })));
        let mut running = lp.spawn().unwrap();
        evt.write(3).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while *seen.lock().unwrap() != 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(*seen.lock().unwrap(), 3);
        running.stop();
    }
}
