//! A workspace's serial console on disk: `console.log`, moved to
//! `console.log.1` when it reaches [`CONSOLE_LOG_CAP`], so a chatty guest
//! never uses more than twice that. Readers tail both files.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The current console file.
pub const CONSOLE_FILE: &str = "console.log";
/// The previous one.
pub const CONSOLE_FILE_OLD: &str = "console.log.1";
/// Bytes one file holds before it is rotated.
pub const CONSOLE_LOG_CAP: u64 = 1 << 20;

/// Why the console log could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleLogError {
    /// Opening, reading or rotating failed.
    #[error("console log {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// The writer the VMM gives the serial device.
#[derive(Debug)]
pub struct ConsoleLogWriter {
    dir: PathBuf,
    file: File,
    len: u64,
    cap: u64,
}

impl ConsoleLogWriter {
    /// Starts a fresh log in `dir` (the previous run's log becomes `.1`).
    pub fn create(dir: &Path) -> Result<Self, ConsoleLogError> {
        Self::with_cap(dir, CONSOLE_LOG_CAP)
    }

    fn with_cap(dir: &Path, cap: u64) -> Result<Self, ConsoleLogError> {
        let path = dir.join(CONSOLE_FILE);
        if path.exists() {
            rotate(dir)?;
        }
        let file = open_new(&path)?;
        Ok(Self {
            dir: dir.to_owned(),
            file,
            len: 0,
            cap,
        })
    }
}

fn open_new(path: &Path) -> Result<File, ConsoleLogError> {
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .map_err(|source| ConsoleLogError::Io {
            path: path.to_owned(),
            source,
        })
}

fn rotate(dir: &Path) -> Result<(), ConsoleLogError> {
    let from = dir.join(CONSOLE_FILE);
    std::fs::rename(&from, dir.join(CONSOLE_FILE_OLD))
        .map_err(|source| ConsoleLogError::Io { path: from, source })
}

impl Write for ConsoleLogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.len + buf.len() as u64 > self.cap && self.len > 0 {
            rotate(&self.dir).map_err(std::io::Error::other)?;
            self.file = open_new(&self.dir.join(CONSOLE_FILE)).map_err(std::io::Error::other)?;
            self.len = 0;
        }
        let n = self.file.write(buf)?;
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

fn read_all(path: &Path) -> Result<Vec<u8>, ConsoleLogError> {
    match std::fs::read(path) {
        Ok(b) => Ok(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(ConsoleLogError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// The console so far (both files, oldest first).
pub fn read_console(dir: &Path) -> Result<Vec<u8>, ConsoleLogError> {
    let mut all = read_all(&dir.join(CONSOLE_FILE_OLD))?;
    all.extend(read_all(&dir.join(CONSOLE_FILE))?);
    Ok(all)
}

/// The last `n` lines of the console (carriage returns dropped).
pub fn tail_lines(dir: &Path, n: usize) -> Result<Vec<String>, ConsoleLogError> {
    let text = String::from_utf8_lossy(&read_console(dir)?).replace('\r', "");
    let lines: Vec<&str> = text.lines().collect();
    Ok(lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|s| s.to_string())
        .collect())
}

/// Follows `console.log` from a byte offset: returns new bytes and the new
/// offset. A file shorter than the offset was rotated; reading starts over.
pub fn read_from(dir: &Path, offset: u64) -> Result<(Vec<u8>, u64), ConsoleLogError> {
    let path = dir.join(CONSOLE_FILE);
    let err = |source| ConsoleLogError::Io {
        path: path.clone(),
        source,
    };
    let mut file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(err(e)),
    };
    let len = file.metadata().map_err(err)?.len();
    let start = if len < offset { 0 } else { offset };
    file.seek(SeekFrom::Start(start)).map_err(err)?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf).map_err(err)?;
    let end = start + buf.len() as u64;
    Ok((buf, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_at_the_cap_and_tails_across_files() {
        let dir = std::env::temp_dir().join(format!("microagent-console-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = ConsoleLogWriter::with_cap(&dir, 64).unwrap();
        for i in 0..20 {
            write!(w, "line {i}\r\n").unwrap();
        }
        let size = |f| std::fs::metadata(dir.join(f)).unwrap().len();
        assert!(size(CONSOLE_FILE) <= 64 && size(CONSOLE_FILE_OLD) <= 64);
        assert_eq!(tail_lines(&dir, 2).unwrap(), vec!["line 18", "line 19"]);
        let (bytes, off) = read_from(&dir, 0).unwrap();
        assert!(String::from_utf8_lossy(&bytes).ends_with("line 19\r\n"));
        assert_eq!(read_from(&dir, off).unwrap().0, b"");
        // A new run keeps the previous run's console as `.1`.
        drop(w);
        let mut w = ConsoleLogWriter::create(&dir).unwrap();
        w.write_all(b"boot\n").unwrap();
        assert_eq!(tail_lines(&dir, 2).unwrap(), vec!["line 19", "boot"]);
        // Rotation shows up as a shorter file: reading starts over.
        assert_eq!(read_from(&dir, off + 100).unwrap().0, b"boot\n");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
