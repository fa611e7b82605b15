//! Reading an ext4 disk a guest wrote, through `debugfs`, by inode only.
//!
//! debugfs runs through the host-tool runner, read-only (`-c`), from a
//! command file holding nothing but command words and
//! inode numbers (no name from the disk is ever handed back to it). It may
//! not write any host file (`RLIMIT_FSIZE` 0: its output goes to a pipe),
//! its address space is capped, and each run has a deadline after which it
//! is killed. Its output is read as a stream, each line under a length
//! bound, and checked against what was asked for: `ls -p <ino>` sections
//! begin with debugfs's echo of the command, `cat <ino>` output is exactly
//! the size the listing gave, else the read fails.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::VolumeError;
use crate::host_tool::{HostTool, HostToolError, ToolLimits};

/// Most bytes of directory listings one export reads.
pub const MAX_LISTING_BYTES: u64 = 256 << 20;
/// Longest listing line taken (an ext4 name is at most 255 bytes).
const MAX_LINE: usize = 4096;
/// Most bytes of debugfs's stderr kept for an error message.
const MAX_STDERR: usize = 16 << 10;
/// Address space debugfs may use.
const DEBUGFS_MAX_AS: u64 = 4 << 30;
/// How long one listing run may take.
pub(super) const LIST_DEADLINE: Duration = Duration::from_secs(120);

/// One directory entry as `ls -p` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DirEntry {
    /// Its inode.
    pub ino: u32,
    /// The inode's `i_mode` (type and permission bits).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// The name as printed: debugfs prints it up to its first NUL.
    pub name: Vec<u8>,
    /// The inode's size (none for directories).
    pub size: Option<u64>,
}

/// A directory's entries, and how many lines of its listing were not
/// entries (a name holding a newline splits its line).
#[derive(Debug, Default)]
pub(super) struct Listing {
    pub entries: Vec<DirEntry>,
    pub unreadable: u64,
}

/// debugfs on one disk.
pub(super) struct Debugfs<'a> {
    exe: PathBuf,
    disk: &'a Path,
    /// A private directory for the command file.
    work: &'a Path,
}

impl<'a> Debugfs<'a> {
    pub(super) fn new(exe: PathBuf, disk: &'a Path, work: &'a Path) -> Self {
        Self { exe, disk, work }
    }

    /// Lists the directories `dirs`; `budget` is what listing output may
    /// still take (bytes), lowered by what this run read.
    pub(super) fn list(&self, dirs: &[u32], budget: &mut u64) -> Result<Vec<Listing>, VolumeError> {
        let commands: String = dirs.iter().map(|d| format!("ls -p <{d}>\n")).collect();
        let mut out: Vec<Listing> = dirs.iter().map(|_| Listing::default()).collect();
        self.run(&commands, LIST_DEADLINE, |stdout| {
            let mut current: Option<usize> = None;
            let mut line = Vec::new();
            loop {
                let (read, whole) = read_line(stdout, &mut line)?;
                if read == 0 {
                    break;
                }
                *budget = budget
                    .checked_sub(read as u64)
                    .ok_or(VolumeError::ExportOverLimit {
                        what: "bytes of directory listings",
                        limit: MAX_LISTING_BYTES,
                    })?;
                let next = current.map_or(0, |c| c + 1);
                if next < dirs.len()
                    && line == format!("debugfs: ls -p <{}>", dirs[next]).as_bytes()
                {
                    current = Some(next);
                    continue;
                }
                let Some(at) = current else { continue };
                if line.is_empty() {
                    continue;
                }
                match parse_entry(&line).filter(|_| whole) {
                    Some(entry) => out[at].entries.push(entry),
                    None => out[at].unreadable += 1,
                }
            }
            match current {
                Some(c) if c + 1 == dirs.len() => Ok(out),
                _ => Err(VolumeError::DiskUnreadable(
                    "debugfs listed fewer directories than asked for".into(),
                )),
            }
        })
    }

    /// The targets of the symlinks `links` (inode, size) that keep them in
    /// the inode (`stat`'s "Fast link dest", exactly `size` bytes between
    /// its quotes, read by position so a target holding newlines or quotes
    /// is read whole); `None` for those that keep them in a block (read
    /// those with [`Debugfs::read_each`]: `cat` of a fast link reads its
    /// target as block numbers).
    pub(super) fn link_targets(
        &self,
        links: &[(u32, u64)],
    ) -> Result<Vec<Option<Vec<u8>>>, VolumeError> {
        const FAST: &[u8] = b"Fast link dest: \"";
        let commands: String = links.iter().map(|(i, _)| format!("stat <{i}>\n")).collect();
        self.run(&commands, LIST_DEADLINE, |stdout| {
            let mut targets = vec![None; links.len()];
            let mut current: Option<usize> = None;
            let mut line = Vec::new();
            loop {
                if read_line(stdout, &mut line)?.0 == 0 {
                    break;
                }
                let next = current.map_or(0, |c| c + 1);
                if next < links.len()
                    && line == format!("debugfs: stat <{}>", links[next].0).as_bytes()
                {
                    current = Some(next);
                    continue;
                }
                let Some(at) = current.filter(|&c| targets[c].is_none()) else {
                    continue;
                };
                // Lines before it are escaped by debugfs (extended
                // attributes): the first line that begins so is the link.
                let Some(rest) = line.strip_prefix(FAST) else {
                    continue;
                };
                let size = links[at].1 as usize;
                let mut target = rest.to_vec();
                while target.len() < size + 1 {
                    if read_line(stdout, &mut line)?.0 == 0 {
                        break;
                    }
                    target.push(b'\n');
                    target.extend_from_slice(&line);
                }
                if target.len() != size + 1 || target[size] != b'"' {
                    return Err(VolumeError::DiskUnreadable(format!(
                        "the target of symlink inode {} is not the {size} bytes its listing gave",
                        links[at].0
                    )));
                }
                target.truncate(size);
                targets[at] = Some(target);
            }
            match current {
                Some(c) if c + 1 == links.len() => Ok(targets),
                _ => Err(VolumeError::DiskUnreadable(
                    "debugfs described fewer symlinks than asked for".into(),
                )),
            }
        })
    }

    /// Reads inodes `wanted` (inode, size): `each(i, reader)` gets the
    /// `i`th one's bytes (exactly its size) and must read them all.
    pub(super) fn read_each(
        &self,
        wanted: &[(u32, u64)],
        deadline: Duration,
        mut each: impl FnMut(usize, &mut dyn Read) -> Result<(), VolumeError>,
    ) -> Result<(), VolumeError> {
        let commands: String = wanted.iter().map(|(i, _)| format!("cat <{i}>\n")).collect();
        self.run(&commands, deadline, |stdout| {
            let mut line = Vec::new();
            for (at, (ino, size)) in wanted.iter().enumerate() {
                let mismatch = || {
                    VolumeError::DiskUnreadable(format!(
                        "debugfs's read of inode {ino} is not the {size} bytes its listing gave"
                    ))
                };
                read_line(stdout, &mut line)?;
                if line != format!("debugfs: cat <{ino}>").as_bytes() {
                    return Err(mismatch());
                }
                let mut body = Counted {
                    inner: stdout.take(*size),
                    read: 0,
                };
                each(at, &mut body)?;
                if body.read != *size {
                    return Err(mismatch());
                }
            }
            let mut rest = [0u8; 1];
            match stdout.read(&mut rest) {
                Ok(0) => Ok(()),
                _ => Err(VolumeError::DiskUnreadable(
                    "debugfs wrote more than was asked for".into(),
                )),
            }
        })
    }

    /// Runs debugfs on `commands` and hands its stdout to `read`; kills it
    /// at `deadline`.
    fn run<T>(
        &self,
        commands: &str,
        deadline: Duration,
        read: impl FnOnce(&mut dyn BufRead) -> Result<T, VolumeError>,
    ) -> Result<T, VolumeError> {
        let file = self.work.join("debugfs-commands");
        std::fs::write(&file, commands)
            .map_err(VolumeError::io(format!("writing {}", file.display())))?;
        let tool = HostTool::at("debugfs", &self.exe)
            .arg("-c")
            .arg("-f")
            .arg(&file)
            .arg(self.disk)
            .limits(ToolLimits {
                memory_bytes: DEBUGFS_MAX_AS,
                // Its output goes to a pipe: it may write no host file.
                file_bytes: 0,
                deadline,
                output_bytes: MAX_STDERR,
            });
        let tool_err = |e: HostToolError| VolumeError::Tool {
            tool: "debugfs",
            detail: crate::error_chain::error_chain(&e),
        };
        let mut run = tool.spawn_streaming(Stdio::null()).map_err(tool_err)?;
        let result = match run.stdout() {
            Some(stdout) => read(&mut BufReader::with_capacity(1 << 16, stdout)),
            None => Err(VolumeError::Tool {
                tool: "debugfs",
                detail: "no output pipe".into(),
            }),
        };
        // Output refused early: it need not run on.
        let ended = match result.is_ok() {
            true => run.finish(),
            false => run.stop(),
        };
        let (status, said) = match ended {
            Ok(out) => (
                Some(out.status.success()),
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ),
            Err(HostToolError::TimedOut { .. }) => {
                return Err(VolumeError::ToolTimedOut {
                    tool: "debugfs",
                    secs: deadline.as_secs(),
                })
            }
            Err(e) => return Err(tool_err(e)),
        };
        match (result, status) {
            (Ok(value), Some(true)) => Ok(value),
            (Ok(_), _) => Err(VolumeError::Tool {
                tool: "debugfs",
                detail: said,
            }),
            (Err(VolumeError::DiskUnreadable(what)), _) if !said.is_empty() => {
                Err(VolumeError::DiskUnreadable(format!(
                    "{what} (debugfs said: {})",
                    last_lines(&said)
                )))
            }
            (Err(e), _) => Err(e),
        }
    }
}

fn last_lines(said: &str) -> String {
    let lines: Vec<&str> = said.lines().collect();
    lines[lines.len().saturating_sub(3)..].join("; ")
}

/// Reads one line into `line` (without its `\n`), keeping at most
/// [`MAX_LINE`] bytes; returns the bytes consumed and whether the line was
/// kept whole.
fn read_line(input: &mut dyn BufRead, line: &mut Vec<u8>) -> Result<(usize, bool), VolumeError> {
    let failed = VolumeError::io("reading debugfs's output");
    line.clear();
    let mut consumed = 0;
    let mut whole = true;
    loop {
        let buf = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(failed(e)),
        };
        if buf.is_empty() {
            return Ok((consumed, whole));
        }
        let (take, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        let body = &buf[..if end { take - 1 } else { take }];
        let room = MAX_LINE.saturating_sub(line.len());
        if body.len() > room {
            whole = false;
        }
        line.extend_from_slice(&body[..body.len().min(room)]);
        input.consume(take);
        consumed += take;
        if end {
            return Ok((consumed, whole));
        }
    }
}

/// Parses `/ino/mode/uid/gid/NAME/size/` (a directory's size is empty).
/// The name runs to the last `/` but one, so a name holding `/` is read
/// whole (and then refused).
pub(super) fn parse_entry(line: &[u8]) -> Option<DirEntry> {
    let body = line.strip_prefix(b"/")?.strip_suffix(b"/")?;
    let mut fields = body.splitn(5, |&b| b == b'/');
    let mut number = |radix| {
        let f = fields.next()?;
        if f.is_empty() || !f.iter().all(u8::is_ascii_digit) {
            return None;
        }
        u32::from_str_radix(std::str::from_utf8(f).ok()?, radix).ok()
    };
    let (ino, mode, uid, gid) = (number(10)?, number(8)?, number(10)?, number(10)?);
    let rest = fields.next()?;
    let cut = rest.iter().rposition(|&b| b == b'/')?;
    let (name, size) = (&rest[..cut], &rest[cut + 1..]);
    let size = match size {
        b"" => None,
        digits if digits.iter().all(u8::is_ascii_digit) => {
            Some(std::str::from_utf8(digits).ok()?.parse().ok()?)
        }
        _ => return None,
    };
    Some(DirEntry {
        ino,
        mode,
        uid,
        gid,
        name: name.to_vec(),
        size,
    })
}

/// A reader that counts what went through it.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_lines_parse_with_names_holding_slashes_whole() {
        let file = parse_entry(b"/12/100644/1000/1000/a.txt/3/").unwrap();
        assert_eq!(
            (file.ino, file.mode, file.name.as_slice(), file.size),
            (12, 0o100644, &b"a.txt"[..], Some(3))
        );
        let dir = parse_entry(b"/2/040755/0/0/..//").unwrap();
        assert_eq!((dir.name.as_slice(), dir.size), (&b".."[..], None));
        let slashed = parse_entry(b"/13/100644/0/0/../../tmp/x/5/").unwrap();
        assert_eq!(slashed.name, b"../../tmp/x");
        let empty = parse_entry(b"/14/100644/0/0//0/").unwrap();
        assert!(empty.name.is_empty());
        for bad in [
            &b""[..],
            b"debugfs: ls -p <2>",
            b"/x/100644/0/0/a/1/",
            b"/12/100644/0/0/a/1x/",
            b"/12/100644/0/0/a",
            b"tmp/x/5/",
            b"/99999999999/100644/0/0/a/1/",
        ] {
            assert!(
                parse_entry(bad).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn long_lines_are_cut_and_marked() {
        let mut input =
            std::io::Cursor::new([vec![b'x'; MAX_LINE + 10], b"\nnext\n".to_vec()].concat());
        let mut line = Vec::new();
        let (n, whole) = read_line(&mut input, &mut line).unwrap();
        assert_eq!((n, whole, line.len()), (MAX_LINE + 11, false, MAX_LINE));
        let (_, whole) = read_line(&mut input, &mut line).unwrap();
        assert!(whole);
        assert_eq!(line, b"next");
        assert_eq!(read_line(&mut input, &mut line).unwrap().0, 0);
    }
}
