//! File watches: one inotify descriptor and one thread per watch, which
//! turns the kernel's events into numbered `created`, `modified`,
//! `deleted` and `moved` events kept (at most [`MAX_WATCH_EVENTS`]) for
//! any later connection to read, waiting as `process_output` does.
//!
//! The thread sleeps in `poll` on the inotify descriptor and an eventfd
//! that `watch_stop` writes, so an idle watch costs the guest no wakeups.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use guest_agent::frame::MAX_JSON;
use guest_agent::protocol::{
    AgentErrorCode, WatchBatch, WatchEntry, WatchEvent, WatchEventKind, MAX_WATCHES,
    MAX_WATCH_DIRS, MAX_WATCH_EVENTS, MAX_WATCH_READ, MAX_WATCH_WAIT,
};

use super::files::checked_path;
use super::{spawn_thread, unix_ms};

/// Stack of a watch's thread (its read buffer is on the heap).
const THREAD_STACK: usize = 64 << 10;
/// What one read of the inotify descriptor takes at most.
const READ_BUFFER: usize = 64 << 10;
/// Room left in an answer for everything but its events.
const ANSWER_ROOM: usize = MAX_JSON - (8 << 10);
/// What a directory is watched for.
const DIR_MASK: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MODIFY
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR
    | libc::IN_DONT_FOLLOW;
/// What a single file is watched for.
const FILE_MASK: u32 = libc::IN_MODIFY | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;
/// Longest directory path a watch follows (PATH_MAX): renames nesting
/// followed directories could otherwise make its stored paths grow
/// without end; deeper ones are given up with an `overflow`.
const MAX_DIR_PATH: usize = 4096;
/// Most JSON bytes of the watched path (escaped: control characters take
/// six), so an answer always has room for its events.
const MAX_ROOT_JSON: usize = 4096;
/// Most entries one scan of a new directory reads (beyond: `overflow`).
const MAX_SCAN_ENTRIES: usize = 65536;

/// Why a watch request failed.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("watch path")]
    Path(#[source] super::files::FileError),
    #[error("{0} does not exist or cannot be watched")]
    Missing(PathBuf, #[source] io::Error),
    #[error("{MAX_WATCHES} watches already; stop one first")]
    Full,
    #[error("{path} has more than {MAX_WATCH_DIRS} directories; watch a smaller tree")]
    TooManyDirs { path: PathBuf },
    #[error("the path is too long to watch (at most {MAX_ROOT_JSON} bytes as JSON)")]
    PathTooLong,
    #[error("no watch {0:?} (never started, or stopped)")]
    Unknown(String),
    #[error("a wait of {0} ms is over the limit of {max} ms", max = MAX_WATCH_WAIT.as_millis())]
    WaitTooLong(u64),
    #[error("making an inotify descriptor")]
    Inotify(#[source] io::Error),
    #[error("starting the watch's thread")]
    Thread(#[source] io::Error),
}

impl WatchError {
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::Path(e) => e.code(),
            Self::Missing(_, e) => AgentErrorCode::from_io(e.kind()),
            Self::Full | Self::TooManyDirs { .. } | Self::PathTooLong => AgentErrorCode::TooLarge,
            Self::Unknown(_) => AgentErrorCode::NotFound,
            Self::WaitTooLong(_) => AgentErrorCode::InvalidInput,
            Self::Inotify(_) | Self::Thread(_) => AgentErrorCode::Internal,
        }
    }
}

/// What a watch has seen, under its lock.
struct Seen {
    /// Directory (or the watched file) of each inotify watch descriptor.
    dirs: HashMap<i32, PathBuf>,
    events: VecDeque<WatchEvent>,
    next_seq: u64,
    /// Events below this were handed to a reader.
    read_to: u64,
    /// Paths reported `created` by a scan of a new directory, whose own
    /// creation event may still come (made while its watch was added).
    scanned: HashSet<PathBuf>,
    ended: bool,
}

impl Seen {
    fn new() -> Self {
        Self {
            dirs: HashMap::new(),
            events: VecDeque::new(),
            next_seq: 0,
            read_to: 0,
            scanned: HashSet::new(),
            ended: false,
        }
    }

    fn push(&mut self, path: &Path, kind: WatchEventKind, to: Option<&Path>) {
        let at_ms = unix_ms();
        let path = path.to_string_lossy().into_owned();
        // A file written in many pieces is one change until it is read.
        if kind == WatchEventKind::Modified {
            if let Some(last) = self.events.back_mut() {
                if last.kind == kind && last.path == path && last.seq >= self.read_to {
                    last.at_ms = at_ms;
                    return;
                }
            }
        }
        if self.events.len() == MAX_WATCH_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(WatchEvent {
            seq: self.next_seq,
            path,
            kind,
            to: to.map(|t| t.to_string_lossy().into_owned()),
            at_ms,
        });
        self.next_seq += 1;
    }
}

/// One watch.
struct Watch {
    id: String,
    root: PathBuf,
    recursive: bool,
    inotify: OwnedFd,
    /// Written by `watch_stop`: the thread ends.
    stop: OwnedFd,
    seen: Mutex<Seen>,
    changed: Condvar,
}

impl Watch {
    fn lock(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entry(&self) -> WatchEntry {
        let seen = self.lock();
        WatchEntry {
            id: self.id.clone(),
            path: self.root.to_string_lossy().into_owned(),
            recursive: self.recursive,
            dirs: seen.dirs.len() as u32,
            next_seq: seen.next_seq,
            ended: seen.ended,
        }
    }

    /// Adds an inotify watch on `dir` (and, recursive, every directory
    /// under it), reporting as `created` what is already inside when
    /// `report` (a directory made after its parent was watched: what came
    /// into it before its own watch would be missed).
    fn add_tree(&self, seen: &mut Seen, dir: &Path, report: bool) {
        let mut pending = vec![dir.to_owned()];
        let mut scanned = 0usize;
        while let Some(dir) = pending.pop() {
            if seen.dirs.len() >= MAX_WATCH_DIRS || dir.as_os_str().len() > MAX_DIR_PATH {
                seen.push(dir.as_path(), WatchEventKind::Overflow, None);
                continue;
            }
            let wd = match add_watch(&self.inotify, &dir, DIR_MASK) {
                Ok(wd) => wd,
                // The guest's inotify limit: its changes would be missed.
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    seen.push(dir.as_path(), WatchEventKind::Overflow, None);
                    continue;
                }
                Err(_) => continue,
            };
            // Already followed (a bind mount of a followed directory):
            // not walked again, so a loop ends.
            if seen.dirs.insert(wd, dir.clone()).is_some() {
                continue;
            }
            if !report && !self.recursive {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                scanned += 1;
                if scanned > MAX_SCAN_ENTRIES {
                    seen.push(dir.as_path(), WatchEventKind::Overflow, None);
                    return;
                }
                let path = entry.path();
                if report {
                    seen.push(&path, WatchEventKind::Created, None);
                    if seen.scanned.len() >= MAX_WATCH_EVENTS {
                        seen.scanned.clear();
                    }
                    seen.scanned.insert(path.clone());
                }
                let room = seen.dirs.len() + pending.len() < MAX_WATCH_DIRS;
                if self.recursive && room && entry.file_type().is_ok_and(|t| t.is_dir()) {
                    pending.push(path);
                }
            }
        }
    }
}

/// The watches, oldest first.
#[derive(Default)]
pub struct Watches {
    list: Mutex<Vec<Arc<Watch>>>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches").finish_non_exhaustive()
    }
}

impl Watches {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Watch>>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn find(&self, id: &str) -> Result<Arc<Watch>, WatchError> {
        self.lock()
            .iter()
            .find(|w| w.id == id)
            .cloned()
            .ok_or_else(|| WatchError::Unknown(id.to_owned()))
    }

    /// Starts a watch on `path`.
    pub fn start(&self, path: &str, recursive: bool) -> Result<WatchEntry, WatchError> {
        let root = checked_path(path).map_err(WatchError::Path)?;
        if serde_json::to_vec(&root.to_string_lossy()).map_or(usize::MAX, |v| v.len())
            > MAX_ROOT_JSON
        {
            return Err(WatchError::PathTooLong);
        }
        let meta =
            std::fs::symlink_metadata(&root).map_err(|e| WatchError::Missing(root.clone(), e))?;
        // Counted again below: the tree walk runs without the list's lock,
        // which every other watch request takes.
        if self.lock().len() >= MAX_WATCHES {
            return Err(WatchError::Full);
        }
        // SAFETY: inotify_init1 takes flags only; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd < 0 {
            return Err(WatchError::Inotify(io::Error::last_os_error()));
        }
        // SAFETY: a descriptor just made and owned by nothing else.
        let inotify = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: eventfd takes a count and flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(WatchError::Inotify(io::Error::last_os_error()));
        }
        // SAFETY: as above.
        let stop = unsafe { OwnedFd::from_raw_fd(fd) };
        let id = format!("watch-{}", self.next_id.fetch_add(1, Ordering::SeqCst) + 1);
        let watch = Arc::new(Watch {
            id,
            root: root.clone(),
            recursive,
            inotify,
            stop,
            seen: Mutex::new(Seen::new()),
            changed: Condvar::new(),
        });
        {
            let mut seen = watch.lock();
            if meta.is_dir() {
                watch.add_tree(&mut seen, &root, false);
                if seen.dirs.len() >= MAX_WATCH_DIRS {
                    return Err(WatchError::TooManyDirs { path: root });
                }
            } else {
                let wd = add_watch(&watch.inotify, &root, FILE_MASK)
                    .map_err(|e| WatchError::Missing(root.clone(), e))?;
                seen.dirs.insert(wd, root.clone());
            }
            if seen.dirs.is_empty() {
                return Err(WatchError::Missing(
                    root,
                    io::Error::from(io::ErrorKind::PermissionDenied),
                ));
            }
        }
        let mut list = self.lock();
        if list.len() >= MAX_WATCHES {
            return Err(WatchError::Full);
        }
        let runner = watch.clone();
        spawn_thread("watch", THREAD_STACK, move || follow(&runner)).map_err(WatchError::Thread)?;
        let entry = watch.entry();
        list.push(watch);
        Ok(entry)
    }

    /// Events of watch `id` from `since`, waiting up to `wait_ms` for one.
    pub fn events(
        &self,
        id: &str,
        since: u64,
        wait_ms: Option<u64>,
    ) -> Result<WatchBatch, WatchError> {
        let wait_ms = wait_ms.unwrap_or(0);
        if u128::from(wait_ms) > MAX_WATCH_WAIT.as_millis() {
            return Err(WatchError::WaitTooLong(wait_ms));
        }
        let watch = self.find(id)?;
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let mut seen = watch.lock();
        while seen.next_seq <= since && !seen.ended {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            seen = watch
                .changed
                .wait_timeout(seen, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let (events, next) = batch(&seen, &watch.root, since);
        seen.read_to = seen.read_to.max(next);
        drop(seen);
        Ok(WatchBatch {
            watch: watch.entry(),
            events,
            next,
        })
    }

    /// Ends watch `id`.
    pub fn stop(&self, id: &str) -> Result<(), WatchError> {
        let watch = {
            let mut list = self.lock();
            let at = list
                .iter()
                .position(|w| w.id == id)
                .ok_or_else(|| WatchError::Unknown(id.to_owned()))?;
            list.remove(at)
        };
        wake(&watch.stop);
        Ok(())
    }

    /// Every watch, oldest first.
    pub fn list(&self) -> Vec<WatchEntry> {
        // Each watch's lock without the list's: a watch busy scanning a
        // new directory holds only its own.
        let watches: Vec<Arc<Watch>> = self.lock().clone();
        watches.iter().map(|w| w.entry()).collect()
    }
}

/// Events from `since` that fit one answer beside the watch's entry, with
/// an `overflow` first when some from `since` on are no longer kept; and
/// the next `since`. An event too large for any answer (long paths in
/// escaped JSON) is given as an `overflow` at its number, so a reader
/// always moves on.
fn batch(seen: &Seen, root: &Path, since: u64) -> (Vec<WatchEvent>, u64) {
    let overflow = |seq| WatchEvent {
        seq,
        path: root.to_string_lossy().into_owned(),
        kind: WatchEventKind::Overflow,
        to: None,
        at_ms: unix_ms(),
    };
    let json_len = |e: &WatchEvent| serde_json::to_vec(e).map_or(usize::MAX, |v| v.len() + 1);
    let mut events = Vec::new();
    // The entry and an overflow each carry the root path once.
    let mut room = ANSWER_ROOM.saturating_sub(2 * (MAX_ROOT_JSON + 256));
    let oldest = seen.events.front().map_or(seen.next_seq, |e| e.seq);
    let mut next = since.max(oldest).min(seen.next_seq);
    if since < oldest {
        events.push(overflow(since));
    }
    let from = next;
    for event in seen.events.iter().filter(|e| e.seq >= from) {
        if events.len() >= MAX_WATCH_READ {
            break;
        }
        let size = json_len(event);
        if size > room {
            if events.is_empty() {
                events.push(overflow(event.seq));
                next = event.seq + 1;
            }
            break;
        }
        room -= size;
        next = event.seq + 1;
        events.push(event.clone());
    }
    (events, next)
}

/// The watch's thread: until `watch_stop`, or its path goes.
fn follow(watch: &Watch) {
    let mut buf = vec![0u8; READ_BUFFER];
    loop {
        let mut fds = [
            libc::pollfd {
                fd: watch.inotify.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: watch.stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds owned by this frame, for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if fds[1].revents != 0 {
            break;
        }
        // SAFETY: reads into a buffer of its length, owned by this frame.
        let got = unsafe {
            libc::read(
                watch.inotify.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if got < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) {
                continue;
            }
            break;
        }
        let raw = parse(&buf[..got as usize]);
        let mut seen = watch.lock();
        apply(watch, &mut seen, &raw);
        let ended = seen.dirs.is_empty();
        seen.ended = ended;
        drop(seen);
        watch.changed.notify_all();
        if ended {
            break;
        }
    }
    let mut seen = watch.lock();
    seen.ended = true;
    drop(seen);
    watch.changed.notify_all();
}

/// One kernel event, its name taken out.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawEvent {
    wd: i32,
    mask: u32,
    cookie: u32,
    name: Vec<u8>,
}

/// The events in what one read gave; a truncated last one is left out.
fn parse(mut buf: &[u8]) -> Vec<RawEvent> {
    const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
    let mut out = Vec::new();
    while buf.len() >= HEADER {
        let field =
            |at: usize| u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
        let (wd, mask, cookie, len) = (field(0) as i32, field(4), field(8), field(12) as usize);
        let Some(name) = buf.get(HEADER..HEADER.saturating_add(len)) else {
            break;
        };
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        out.push(RawEvent {
            wd,
            mask,
            cookie,
            name: name[..end].to_vec(),
        });
        buf = &buf[HEADER + len..];
    }
    out
}

/// Turns a read's kernel events into the watch's events.
fn apply(watch: &Watch, seen: &mut Seen, raw: &[RawEvent]) {
    let mut i = 0;
    while i < raw.len() {
        let event = &raw[i];
        i += 1;
        if event.mask & libc::IN_Q_OVERFLOW != 0 {
            seen.push(&watch.root.clone(), WatchEventKind::Overflow, None);
            continue;
        }
        if event.mask & libc::IN_IGNORED != 0 {
            seen.dirs.remove(&event.wd);
            continue;
        }
        let Some(dir) = seen.dirs.get(&event.wd).cloned() else {
            continue;
        };
        let path = if event.name.is_empty() {
            dir.clone()
        } else {
            dir.join(OsStr::from_bytes(&event.name))
        };
        let is_dir = event.mask & libc::IN_ISDIR != 0;
        if event.mask & libc::IN_MOVED_FROM != 0 {
            let to = raw
                .get(i)
                .filter(|next| next.mask & libc::IN_MOVED_TO != 0 && next.cookie == event.cookie);
            let to = to.and_then(|next| {
                i += 1;
                let dir = seen.dirs.get(&next.wd)?;
                Some(dir.join(OsStr::from_bytes(&next.name)))
            });
            seen.scanned.remove(&path);
            if is_dir {
                moved_dirs(watch, seen, &path, to.as_deref());
            }
            seen.push(&path, WatchEventKind::Moved, to.as_deref());
        } else if event.mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
            // Already reported (and followed) by the scan of its new
            // parent, which raced its making.
            if seen.scanned.remove(&path) {
                continue;
            }
            seen.push(&path, WatchEventKind::Created, None);
            if is_dir && watch.recursive {
                watch.add_tree(seen, &path, true);
            }
        } else if event.mask & libc::IN_MODIFY != 0 {
            seen.push(&path, WatchEventKind::Modified, None);
        } else if event.mask & libc::IN_DELETE != 0 {
            seen.scanned.remove(&path);
            seen.push(&path, WatchEventKind::Deleted, None);
        } else if event.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0 && dir == watch.root
        {
            // Below the root its parent's event said it; the root's own
            // end is said here, and ends the watch.
            let kind = if event.mask & libc::IN_DELETE_SELF != 0 {
                WatchEventKind::Deleted
            } else {
                WatchEventKind::Moved
            };
            seen.push(&path, kind, None);
            for wd in seen.dirs.keys() {
                // SAFETY: removes a watch descriptor of this descriptor;
                // a stale one only fails.
                unsafe { libc::inotify_rm_watch(watch.inotify.as_raw_fd(), *wd) };
            }
            seen.dirs.clear();
        }
    }
}

/// A directory under the watch moved: its descriptors follow it to `to`,
/// or are dropped when it left the watch (or when renames nested it past
/// [`MAX_DIR_PATH`]: given up, said once with an `overflow`).
fn moved_dirs(watch: &Watch, seen: &mut Seen, from: &Path, to: Option<&Path>) {
    let under: Vec<i32> = seen
        .dirs
        .iter()
        .filter(|(_, dir)| dir.starts_with(from))
        .map(|(wd, _)| *wd)
        .collect();
    let mut given_up = false;
    for wd in under {
        let moved = match (to, seen.dirs.get(&wd)) {
            (Some(to), Some(dir)) => {
                let rest = dir
                    .strip_prefix(from)
                    .map(Path::to_owned)
                    .unwrap_or_default();
                Some(to.join(rest)).filter(|m| m.as_os_str().len() <= MAX_DIR_PATH)
            }
            _ => None,
        };
        match moved {
            Some(moved) => {
                seen.dirs.insert(wd, moved);
            }
            None => {
                given_up |= to.is_some();
                seen.dirs.remove(&wd);
                // SAFETY: removes a watch descriptor of this descriptor;
                // a stale one only fails.
                unsafe { libc::inotify_rm_watch(watch.inotify.as_raw_fd(), wd) };
            }
        }
    }
    if let (true, Some(to)) = (given_up, to) {
        seen.push(to, WatchEventKind::Overflow, None);
    }
}

fn add_watch(inotify: &OwnedFd, path: &Path, mask: u32) -> io::Result<i32> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: a valid descriptor and a NUL-terminated path for the call.
    let wd = unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), c.as_ptr(), mask) };
    if wd < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(wd)
    }
}

fn wake(stop: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a local array to an eventfd.
    unsafe { libc::write(stop.as_raw_fd(), one.as_ptr().cast(), one.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(wd: i32, mask: u32, cookie: u32, name: &str) -> Vec<u8> {
        let padded = if name.is_empty() {
            0
        } else {
            (name.len() + 1).div_ceil(16) * 16
        };
        let mut b = Vec::new();
        for v in [wd as u32, mask, cookie, padded as u32] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        let mut n = name.as_bytes().to_vec();
        n.resize(padded, 0);
        b.extend(n);
        b
    }

    #[test]
    fn kernel_events_are_parsed_and_a_cut_one_left_out() {
        let mut buf = raw(1, libc::IN_CREATE, 0, "a");
        buf.extend(raw(2, libc::IN_MODIFY, 0, ""));
        buf.extend(&raw(1, libc::IN_DELETE, 0, "long-name")[..20]);
        let events = parse(&buf);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].name, b"a");
        assert_eq!((events[1].wd, events[1].name.len()), (2, 0));
        // A length past the buffer, or garbage: nothing, no panic.
        let mut bad = raw(1, libc::IN_CREATE, 0, "a");
        bad[12..16].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(parse(&bad).is_empty());
        assert!(parse(&[7u8; 5]).is_empty());
    }

    fn seen() -> Seen {
        Seen::new()
    }

    #[test]
    fn repeated_writes_are_one_change_and_old_events_give_way() {
        let mut s = seen();
        s.push(Path::new("/w/f"), WatchEventKind::Modified, None);
        s.push(Path::new("/w/f"), WatchEventKind::Modified, None);
        assert_eq!(s.events.len(), 1);
        s.push(Path::new("/w/g"), WatchEventKind::Modified, None);
        assert_eq!(s.next_seq, 2);
        // Once read, a further write is a change of its own.
        s.read_to = 2;
        s.push(Path::new("/w/g"), WatchEventKind::Modified, None);
        assert_eq!(s.next_seq, 3);
        for _ in 0..MAX_WATCH_EVENTS {
            s.push(Path::new("/w/x"), WatchEventKind::Created, None);
        }
        assert_eq!(s.events.len(), MAX_WATCH_EVENTS);
        // From 0: an overflow first, then what is kept, a batch at most.
        let (events, next) = batch(&s, Path::new("/w"), 0);
        assert_eq!(events[0].kind, WatchEventKind::Overflow);
        assert_eq!(events.len(), MAX_WATCH_READ);
        assert_eq!(next, events.last().unwrap().seq + 1);
        // Past the end: nothing, and the same `next`.
        let (events, next) = batch(&s, Path::new("/w"), s.next_seq);
        assert!(events.is_empty());
        assert_eq!(next, s.next_seq);
    }

    #[test]
    fn renames_cannot_nest_a_followed_directory_past_path_max() {
        // SAFETY: as in `Watches::start`; results checked.
        let (inotify, stop) = unsafe {
            let i = libc::inotify_init1(libc::IN_CLOEXEC);
            let e = libc::eventfd(0, libc::EFD_CLOEXEC);
            assert!(i >= 0 && e >= 0);
            (OwnedFd::from_raw_fd(i), OwnedFd::from_raw_fd(e))
        };
        let watch = Watch {
            id: "watch-1".into(),
            root: "/w".into(),
            recursive: true,
            inotify,
            stop,
            seen: Mutex::new(Seen::new()),
            changed: Condvar::new(),
        };
        let mut s = seen();
        s.dirs.insert(1, "/w".into());
        s.dirs.insert(2, "/w/a".into());
        s.dirs.insert(3, "/w/a/b".into());
        moved_dirs(&watch, &mut s, Path::new("/w/a"), Some(Path::new("/w/c")));
        assert_eq!(s.dirs[&3], Path::new("/w/c/b"));
        let deep = format!("/w/{}", "d/".repeat(MAX_DIR_PATH / 2));
        moved_dirs(&watch, &mut s, Path::new("/w/c"), Some(Path::new(&deep)));
        assert!(s.dirs.values().all(|d| d.as_os_str().len() <= MAX_DIR_PATH));
        assert_eq!(s.dirs.len(), 1);
        assert_eq!(s.events.back().unwrap().kind, WatchEventKind::Overflow);
    }

    #[test]
    fn an_event_too_large_for_an_answer_is_passed_as_an_overflow() {
        let mut s = seen();
        let huge = format!("/w/{}", "\u{1}".repeat(20_000));
        s.push(Path::new(&huge), WatchEventKind::Created, None);
        s.push(Path::new("/w/small"), WatchEventKind::Created, None);
        let (events, next) = batch(&s, Path::new("/w"), 0);
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].kind, events[0].seq, next),
            (WatchEventKind::Overflow, 0, 1)
        );
        let (events, next) = batch(&s, Path::new("/w"), next);
        assert_eq!((events[0].path.as_str(), next), ("/w/small", 2));
    }

    #[test]
    fn an_answer_stays_under_the_json_limit_with_long_paths() {
        let mut s = seen();
        let long = format!("/w/{}", "\u{1}".repeat(4000));
        for _ in 0..MAX_WATCH_READ {
            s.push(Path::new(&long), WatchEventKind::Created, None);
        }
        let (events, next) = batch(&s, Path::new("/w"), 0);
        assert!(!events.is_empty() && events.len() < MAX_WATCH_READ);
        let json = serde_json::to_vec(&events).unwrap();
        assert!(json.len() < MAX_JSON, "{}", json.len());
        assert_eq!(next, events.len() as u64);
    }
}
