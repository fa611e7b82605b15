//! The device event loop: one thread running an `event_manager` epoll loop
//! over every device's fds (queue ioeventfds, backend sockets, timers).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use event_manager::{EventManager, EventOps, EventSet, Events, MutEventSubscriber, SubscriberOps};
use vmm_sys_util::eventfd::EventFd;

/// A subscriber as the loop holds it.
pub type Subscriber = Arc<Mutex<dyn MutEventSubscriber + Send>>;

/// An epoll wait with no timeout: the loop wakes only for its devices'
/// fds and its waker (a stop writes the waker), so an idle guest's loop
/// costs the host nothing between events.
const WAIT_FOREVER: i32 = -1;

/// Why the loop could not be created or started.
#[derive(Debug, thiserror::Error)]
pub enum EventLoopError {
    /// epoll could not be created.
    #[error("could not create the device event loop")]
    Create(#[source] event_manager::Error),
    /// The thread could not be spawned.
    #[error("could not start the device event loop thread")]
    Spawn(#[source] std::io::Error),
    /// The wake-up eventfd could not be created.
    #[error("could not create the device event loop's wake-up eventfd")]
    Waker(#[source] std::io::Error),
    /// The loop's thread panicked, so its devices are gone.
    #[error("the device event loop thread panicked")]
    Panicked,
}

/// Ends an epoll wait at once when the loop is asked to stop.
struct Waker(EventFd);

impl MutEventSubscriber for Waker {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.0, EventSet::IN)) {
            tracing::error!("device event loop: cannot watch its waker: {e:?}");
        }
    }
    fn process(&mut self, _: Events, _: &mut EventOps) {
        let _ = self.0.read();
    }
}

/// The loop before it runs: devices are added here (their `init` registers
/// their fds).
pub struct EventLoop {
    manager: EventManager<Subscriber>,
    waker: EventFd,
}

impl std::fmt::Debug for EventLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventLoop")
    }
}

impl EventLoop {
    /// An empty loop.
    pub fn new() -> Result<Self, EventLoopError> {
        let mut manager = EventManager::new().map_err(EventLoopError::Create)?;
        let waker =
            EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).map_err(EventLoopError::Waker)?;
        let ours = waker.try_clone().map_err(EventLoopError::Waker)?;
        let waker_sub: Subscriber = Arc::new(Mutex::new(Waker(ours)));
        manager.add_subscriber(waker_sub);
        Ok(Self { manager, waker })
    }

    /// Adds a device.
    pub fn add(&mut self, subscriber: Subscriber) {
        self.manager.add_subscriber(subscriber);
    }

    /// Runs the loop on its own thread until the returned handle is stopped
    /// or paused.
    pub fn spawn(self) -> Result<RunningEventLoop, Box<(EventLoop, EventLoopError)>> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let waker = match self.waker.try_clone() {
            Ok(w) => w,
            Err(e) => return Err(Box::new((self, EventLoopError::Waker(e)))),
        };
        let builder = std::thread::Builder::new().name("devices".into());
        let handle = crate::spawn::spawn_owning(builder, self, move |mut me: EventLoop| {
            if let Err(e) = crate::seccomp::enter(crate::seccomp::ThreadRole::Devices) {
                // Devices stay still rather than run unconfined.
                tracing::error!("device event loop not started: {e}");
                return me;
            }
            while !thread_stop.load(Ordering::Acquire) {
                if let Err(e) = me.manager.run_with_timeout(WAIT_FOREVER) {
                    tracing::error!("device event loop: {e}");
                    break;
                }
            }
            me
        })
        .map_err(|failed| Box::new((failed.value, EventLoopError::Spawn(failed.error))))?;
        Ok(RunningEventLoop {
            stop,
            waker,
            handle: Some(handle),
        })
    }
}

/// A running loop; dropping it stops and joins the thread.
#[derive(Debug)]
pub struct RunningEventLoop {
    stop: Arc<AtomicBool>,
    waker: EventFd,
    handle: Option<JoinHandle<EventLoop>>,
}

impl RunningEventLoop {
    fn join(&mut self) -> Option<EventLoop> {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.write(1);
        match self.handle.take()?.join() {
            Ok(lp) => Some(lp),
            Err(_) => {
                tracing::error!("device event loop thread panicked");
                None
            }
        }
    }

    /// Stops the loop and waits for its thread.
    pub fn stop(&mut self) {
        self.join();
    }

    /// Stops the loop and hands it back, its devices untouched: no device
    /// processes anything until it is spawned again.
    pub fn pause(mut self) -> Result<EventLoop, EventLoopError> {
        self.join().ok_or(EventLoopError::Panicked)
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
        let evt = EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC).unwrap();
        let seen = Arc::new(Mutex::new(0));
        let mut lp = EventLoop::new().unwrap();
        lp.add(Arc::new(Mutex::new(Counter {
            evt: evt.try_clone().unwrap(),
            seen: seen.clone(),
        })));
        let running = lp.spawn().map_err(|b| b.1).unwrap();
        evt.write(3).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while *seen.lock().unwrap() != 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(*seen.lock().unwrap(), 3);
        // Paused, nothing is processed; spawned again, the backlog is.
        let paused = running.pause().unwrap();
        evt.write(2).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(*seen.lock().unwrap(), 3);
        let mut running = paused.spawn().map_err(|b| b.1).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while *seen.lock().unwrap() != 5 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(*seen.lock().unwrap(), 5);
        running.stop();
    }
}
