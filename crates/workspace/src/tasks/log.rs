//! A task's command log (`task.log`): what the guest prints, so the host
//! bounds it. [`CappedLog`] keeps the file under a cap: when a write would
//! pass it, the newest half is kept (from a line start) beneath one marker
//! line saying how many bytes were dropped, in a new file renamed over the
//! old one, so a crash leaves one whole log or the other. Where the kept
//! part starts in everything the task printed is in `task.log.state`,
//! keyed by the file's inode and written before the rename (a reader that
//! finds no entry for its file reads it as never cut). Readers address the
//! log by offsets into everything the task printed ([`read_log`]), so a
//! follower keeps its place across a cut, and a read holds at most its
//! limit in memory.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The cap of a task's log unless `config.json` says (`task.max_log_bytes`).
pub const DEFAULT_MAX_LOG_BYTES: u64 = 64 << 20;
/// The smallest cap `config.json` may set.
pub const MIN_MAX_LOG_BYTES: u64 = 64 << 10;
/// Most bytes one read returns (the hard maximum of any `limit`).
pub const MAX_LOG_READ: u64 = 4 << 20;
/// Bytes one read returns unless asked otherwise.
pub const DEFAULT_LOG_READ: u64 = 64 << 10;
/// How far past a cut point the writer looks for a line start.
const LINE_WINDOW: u64 = 4096;
/// Chunk of the copy a cut makes.
const COPY_CHUNK: usize = 64 << 10;

/// One cut of the log: the file (by inode) it made, and where that file's
/// output starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Cut {
    inode: u64,
    /// Bytes of output before the file's first kept byte.
    dropped_bytes: u64,
    /// Length of the marker line at the file's start.
    header_bytes: u64,
}

/// The last two cuts: a reader that opened the file just before a cut
/// still finds its own.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct CutState {
    cuts: Vec<Cut>,
}

fn state_path(log: &Path) -> PathBuf {
    let mut name = log.file_name().unwrap_or_default().to_owned();
    name.push(".state");
    log.with_file_name(name)
}

/// The cut that made `file` (none: it was never cut).
fn cut_of(log: &Path, file: &File) -> io::Result<Cut> {
    let inode = file.metadata()?.ino();
    // Bounded: the writer writes at most two entries.
    let state: CutState = match std::fs::read(state_path(log)) {
        Ok(bytes) if bytes.len() <= 4096 => serde_json::from_slice(&bytes).unwrap_or_default(),
        _ => CutState::default(),
    };
    Ok(state
        .cuts
        .into_iter()
        .find(|c| c.inode == inode)
        .unwrap_or_default())
}

/// The marker line a cut leaves at the log's start.
pub fn marker(dropped: u64, cap: u64) -> String {
    format!("[microagent: the first {dropped} bytes of this log were dropped to keep it under {cap} bytes]\n")
}

/// A task's log as its supervisor appends to it, kept under its cap.
#[derive(Debug)]
pub struct CappedLog {
    path: PathBuf,
    file: File,
    cap: u64,
    /// The file's length.
    len: u64,
    cut: Cut,
    /// A failed write was logged.
    warned: bool,
}

impl CappedLog {
    /// Opens (or creates) the log at `path`, capped at `cap` bytes (at
    /// least [`MIN_MAX_LOG_BYTES`]).
    pub fn open(path: &Path, cap: u64) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let len = file.metadata()?.len();
        let cut = cut_of(path, &file)?;
        Ok(Self {
            path: path.to_owned(),
            file,
            cap: cap.max(MIN_MAX_LOG_BYTES),
            len,
            cut,
            warned: false,
        })
    }

    /// The file's length now.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of output dropped so far.
    pub fn dropped_bytes(&self) -> u64 {
        self.cut.dropped_bytes
    }

    /// [`CappedLog::write`], a failure said once in the supervisor's log
    /// (the command runs on; its output is what is lost).
    pub fn write_or_warn(&mut self, data: &[u8]) {
        if let Err(e) = self.write(data) {
            if !self.warned {
                self.warned = true;
                tracing::warn!("writing {}: {e}", self.path.display());
            }
        }
    }

    /// Appends `data`, cutting the log first when it would pass the cap.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.len.saturating_add(data.len() as u64) <= self.cap {
            self.file.write_all(data)?;
            self.len += data.len() as u64;
            return Ok(());
        }
        self.cut_and_write(data)
    }

    /// Writes a new file: the marker, then the newest half of the old
    /// output followed by `data`, from a line start; renames it over the
    /// log.
    fn cut_and_write(&mut self, data: &[u8]) -> io::Result<()> {
        // The output as it is: the old file's body, then `data`.
        let body = self.len.saturating_sub(self.cut.header_bytes);
        let total = body + data.len() as u64;
        // Room for the marker, whatever its digits.
        let keep = (self.cap / 2).min(total);
        let mut start = total - keep;
        let window = self.window(start, LINE_WINDOW.min(keep), body, data)?;
        if let Some(nl) = window.iter().position(|b| *b == b'\n') {
            start += nl as u64 + 1;
        }
        let dropped = self.cut.dropped_bytes + start;
        let header = marker(dropped, self.cap);
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(
            ".{}.{}.cut",
            self.path.file_name().unwrap_or_default().to_string_lossy(),
            base::host::dirfd::random_hex()
        ));
        let made = (|| {
            let mut new = OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            new.write_all(header.as_bytes())?;
            let mut at = start;
            let mut buf = vec![0u8; COPY_CHUNK];
            while at < body {
                let n = (body - at).min(COPY_CHUNK as u64) as usize;
                self.file
                    .read_exact_at(&mut buf[..n], self.cut.header_bytes + at)?;
                new.write_all(&buf[..n])?;
                at += n as u64;
            }
            let from_data = (start.saturating_sub(body)) as usize;
            new.write_all(&data[from_data.min(data.len())..])?;
            new.sync_data()?;
            let cut = Cut {
                inode: new.metadata()?.ino(),
                dropped_bytes: dropped,
                header_bytes: header.len() as u64,
            };
            // Before the rename: the file is never current without its cut.
            let state = CutState {
                cuts: vec![cut, self.cut],
            };
            base::store::write_json_atomic(&state_path(&self.path), &state)
                .map_err(io::Error::other)?;
            std::fs::rename(&tmp, &self.path)?;
            Ok::<_, io::Error>((new, cut))
        })();
        match made {
            Ok((new, cut)) => {
                self.len = new.metadata()?.len();
                self.file = new;
                self.cut = cut;
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Up to `n` bytes of the output from `at`, across the old file's
    /// body (`body` bytes) and `data`.
    fn window(&self, at: u64, n: u64, body: u64, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(n as usize);
        if at < body {
            let from_file = (body - at).min(n) as usize;
            out.resize(from_file, 0);
            self.file
                .read_exact_at(&mut out, self.cut.header_bytes + at)?;
        }
        let want = n as usize - out.len();
        let from = at.saturating_sub(body) as usize;
        let from = from.min(data.len());
        out.extend_from_slice(&data[from..(from + want).min(data.len())]);
        Ok(out)
    }
}

/// What part of a log to read. Offsets count bytes of everything the task
/// printed (a cut does not move them); `limit` is clamped to
/// 1..=[`MAX_LOG_READ`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogRange {
    /// The last `lines` lines, within the last `limit` bytes.
    Tail {
        /// Lines.
        lines: usize,
        /// Most bytes.
        limit: u64,
    },
    /// Up to `limit` bytes from `offset`.
    From {
        /// Where to start.
        offset: u64,
        /// Most bytes.
        limit: u64,
    },
}

/// A range read from a log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogChunk {
    /// The bytes.
    pub data: Vec<u8>,
    /// Where they start (past `dropped_bytes` even when asked for less).
    pub offset: u64,
    /// Where they end: the offset of the next read.
    pub next_offset: u64,
    /// Bytes the task printed so far.
    pub size: u64,
    /// Bytes dropped from the start by cuts (not readable any more).
    pub dropped_bytes: u64,
}

/// Reads `range` of the log at `path` (empty when there is none yet),
/// holding at most the range's limit in memory.
pub fn read_log(path: &Path, range: LogRange) -> io::Result<LogChunk> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(LogChunk::default()),
        Err(e) => return Err(e),
    };
    let cut = cut_of(path, &file)?;
    let len = file.metadata()?.len();
    let header = cut.header_bytes.min(len);
    let body = len - header;
    let dropped = cut.dropped_bytes;
    let size = dropped + body;
    let read_at = |from: u64, n: u64| -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; n as usize];
        let got = read_full_at(&file, &mut buf, header + from)?;
        buf.truncate(got);
        Ok(buf)
    };
    let chunk = |data: Vec<u8>, at: u64| LogChunk {
        next_offset: dropped + at + data.len() as u64,
        offset: dropped + at,
        data,
        size,
        dropped_bytes: dropped,
    };
    match range {
        LogRange::From { offset, limit } => {
            let limit = limit.clamp(1, MAX_LOG_READ);
            let at = offset.clamp(dropped, size) - dropped;
            let n = limit.min(body - at);
            let mut data = read_at(at, n)?;
            if at + (data.len() as u64) < body {
                // More follows: end on a whole character, so the next read
                // starts on one.
                let keep = whole_chars(&data);
                if keep > 0 {
                    data.truncate(keep);
                }
            }
            Ok(chunk(data, at))
        }
        LogRange::Tail { lines, limit } => {
            let limit = limit.clamp(1, MAX_LOG_READ);
            if lines == 0 {
                return Ok(chunk(Vec::new(), body));
            }
            let n = limit.min(body);
            let at = body - n;
            let data = read_at(at, n)?;
            let skip = tail_start(&data, lines, at == 0);
            Ok(chunk(data[skip..].to_vec(), at + skip as u64))
        }
    }
}

/// Reads until `buf` is full or the file ends; the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The length of `data` without a character cut at its end.
fn whole_chars(data: &[u8]) -> usize {
    match std::str::from_utf8(data) {
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        _ => data.len(),
    }
}

/// Where the last `lines` lines of `data` start; `from_start` says `data`
/// begins the log (else a line cut at its start is left out, unless it is
/// the only one).
fn tail_start(data: &[u8], lines: usize, from_start: bool) -> usize {
    let end = data.len() - usize::from(data.last() == Some(&b'\n'));
    let mut seen = 0;
    for (i, b) in data[..end].iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == lines {
                return i + 1;
            }
        }
    }
    if from_start {
        return 0;
    }
    data[..end]
        .iter()
        .position(|b| *b == b'\n')
        .map_or(0, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ma-tasklog-{tag}-{}",
            base::host::settings::unique_id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn from(offset: u64, limit: u64) -> LogRange {
        LogRange::From { offset, limit }
    }

    #[test]
    fn an_endless_stream_stays_under_the_cap_with_a_marker() {
        let dir = scratch("endless");
        let path = dir.join("task.log");
        let cap = MIN_MAX_LOG_BYTES;
        let mut log = CappedLog::open(&path, cap).unwrap();
        let mut printed = 0u64;
        let mut n = 0u64;
        // Lines of every length, and one write bigger than the cap.
        while printed < 40 * cap {
            let line = format!("line {n} {}\n", "x".repeat((n % 300) as usize));
            log.write(line.as_bytes()).unwrap();
            printed += line.len() as u64;
            n += 1;
            assert!(std::fs::metadata(&path).unwrap().len() <= cap);
        }
        let huge = vec![b'y'; 3 * cap as usize];
        log.write(&huge).unwrap();
        printed += huge.len() as u64;
        log.write(b"last line\n").unwrap();
        printed += 10;
        let on_disk = std::fs::read(&path).unwrap();
        assert!(on_disk.len() as u64 <= cap, "{}", on_disk.len());
        let text = String::from_utf8_lossy(&on_disk);
        let dropped = log.dropped_bytes();
        assert!(text.starts_with(&marker(dropped, cap)), "{}", &text[..200]);
        assert!(text.ends_with("yyy\nlast line\n") || text.ends_with("ylast line\n"));
        // Offsets count everything printed.
        let tail = read_log(
            &path,
            LogRange::Tail {
                lines: 1,
                limit: 1024,
            },
        )
        .unwrap();
        assert_eq!(tail.size, printed);
        assert_eq!(tail.dropped_bytes, dropped);
        assert_eq!(tail.next_offset, printed);
        assert!(tail.data.ends_with(b"last line\n"));
        // Nothing left behind by the cuts but the state.
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cut_keeps_a_follower_in_place() {
        let dir = scratch("follow");
        let path = dir.join("task.log");
        let cap = MIN_MAX_LOG_BYTES;
        let mut log = CappedLog::open(&path, cap).unwrap();
        let line = |i: u64| format!("{i:07}\n");
        let mut next = 0u64;
        let mut read_lines = Vec::new();
        for i in 0..40_000u64 {
            log.write(line(i).as_bytes()).unwrap();
            // The follower reads a little now and then, as `-f` does.
            if i % 1000 == 999 {
                loop {
                    let c = read_log(&path, from(next, 4096)).unwrap();
                    assert_eq!(c.offset, next, "never behind the cut here");
                    read_lines.extend(
                        String::from_utf8(c.data.clone())
                            .unwrap()
                            .lines()
                            .map(str::to_owned),
                    );
                    next = c.next_offset;
                    if next == c.size {
                        break;
                    }
                }
            }
        }
        let expected: Vec<String> = (0..40_000).map(|i| format!("{i:07}")).collect();
        assert_eq!(read_lines, expected);
        assert!(log.dropped_bytes() > 0);
        // A reader from before the cut starts where the log now does.
        let old = read_log(&path, from(0, 16)).unwrap();
        assert_eq!(old.offset, log.dropped_bytes());
        assert_eq!(old.data.len(), 16);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ranged_reads_return_the_right_bytes() {
        let dir = scratch("ranges");
        let path = dir.join("task.log");
        assert_eq!(read_log(&path, from(0, 10)).unwrap(), LogChunk::default());
        let mut log = CappedLog::open(&path, DEFAULT_MAX_LOG_BYTES).unwrap();
        log.write(b"one\ntwo\nthree\nfour").unwrap();
        let c = read_log(&path, from(4, 5)).unwrap();
        assert_eq!(
            (c.data.as_slice(), c.offset, c.next_offset),
            (&b"two\nt"[..], 4, 9)
        );
        assert_eq!(c.size, 18);
        let past = read_log(&path, from(100, 5)).unwrap();
        assert_eq!((past.data.len(), past.offset), (0, 18));
        let t = read_log(
            &path,
            LogRange::Tail {
                lines: 2,
                limit: 100,
            },
        )
        .unwrap();
        assert_eq!((t.data.as_slice(), t.offset), (&b"three\nfour"[..], 8));
        let all = read_log(
            &path,
            LogRange::Tail {
                lines: 99,
                limit: 100,
            },
        )
        .unwrap();
        assert_eq!(all.data.len(), 18);
        // Within the limit, a line cut at the start is left out.
        let t = read_log(
            &path,
            LogRange::Tail {
                lines: 9,
                limit: 12,
            },
        )
        .unwrap();
        assert_eq!(t.data, b"three\nfour");
        let none = read_log(
            &path,
            LogRange::Tail {
                lines: 0,
                limit: 12,
            },
        )
        .unwrap();
        assert_eq!((none.data.len(), none.offset), (0, 18));
        // A character is not split between two reads.
        log.write("é\n".as_bytes()).unwrap();
        let c = read_log(&path, from(18, 1)).unwrap();
        assert_eq!(
            c.data,
            "é".as_bytes()[..1].to_vec(),
            "a lone byte is still returned"
        );
        let c = read_log(&path, from(17, 2)).unwrap();
        assert_eq!((c.data.as_slice(), c.next_offset), (&b"r"[..], 18));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_read_of_a_big_log_is_bounded_by_its_limit() {
        let dir = scratch("big");
        let path = dir.join("task.log");
        // 200 MiB of lines, sparse on disk: what is read is what counts.
        let file = File::create(&path).unwrap();
        file.set_len(200 << 20).unwrap();
        file.write_all_at(b"the end\n", 200 << 20).unwrap();
        let started = std::time::Instant::now();
        let t = read_log(
            &path,
            LogRange::Tail {
                lines: 100_000,
                limit: 4096,
            },
        )
        .unwrap();
        assert!(t.data.len() <= 4096);
        assert!(t.data.ends_with(b"the end\n"));
        let c = read_log(&path, from(0, u64::MAX)).unwrap();
        assert_eq!(c.data.len() as u64, MAX_LOG_READ, "the hard maximum");
        assert_eq!(c.size, (200 << 20) + 8);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_forged_marker_or_state_changes_nothing() {
        let dir = scratch("forged");
        let path = dir.join("task.log");
        let mut log = CappedLog::open(&path, DEFAULT_MAX_LOG_BYTES).unwrap();
        let fake = marker(999, 1);
        log.write(fake.as_bytes()).unwrap();
        let c = read_log(&path, from(0, 4096)).unwrap();
        assert_eq!((c.dropped_bytes, c.data), (0, fake.into_bytes()));
        // A state for another file (a crash before the rename) is ignored.
        std::fs::write(
            state_path(&path),
            r#"{"cuts":[{"inode":1,"dropped_bytes":5,"header_bytes":3}]}"#,
        )
        .unwrap();
        assert_eq!(read_log(&path, from(0, 4)).unwrap().offset, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
