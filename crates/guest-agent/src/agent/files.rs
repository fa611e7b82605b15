//! File operations: read_file, write_file, stat, list_dir, mkdir, remove,
//! rename. Paths must be absolute.

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use guest_agent::frame::FrameError;
use guest_agent::protocol::{
    AgentErrorCode, EntryKind, ListedEntry, Response, StatAnswer, WriteMode, DATA_CHUNK,
    MAX_DIR_ENTRIES,
};

use super::conn::Conn;

/// Most bytes a `read_file` without `length` sends from something that is
/// not a regular file (a device, /proc), which may never end.
const MAX_UNSIZED_READ: u64 = 64 << 20;

/// Why a file operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Not an absolute path, or a NUL byte in it.
    #[error("{0:?} is not an absolute path without NUL bytes")]
    BadPath(String),
    /// `perm` has bits outside 0o7777.
    #[error("perm {0:#o} has bits outside 0o7777")]
    BadPerm(u32),
    /// The path has no file name (`/`).
    #[error("{0} names no file")]
    NoFileName(PathBuf),
    /// `remove` of `/`, or of a path with `..` (which might be `/`).
    #[error("refusing to remove {0}: it is / or has a `..` component")]
    RemoveRefused(PathBuf),
    /// Reading a directory, fifo or socket as a file.
    #[error("{0} is not a regular file or device")]
    NotAFile(PathBuf),
    /// `write_file` with mode `create` on an existing path.
    #[error("{0} already exists")]
    Exists(PathBuf),
    /// Looking up metadata failed.
    #[error("stat {path}")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Opening the file failed.
    #[error("opening {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Reading the file failed.
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Writing the file failed.
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Receiving the upload from the client failed.
    #[error("receiving the upload")]
    Receive(#[source] FrameError),
    /// Moving the finished upload into place failed.
    #[error("moving the upload to {path}")]
    Commit {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Listing a directory failed.
    #[error("listing {path}")]
    ListDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// mkdir -p failed.
    #[error("creating directory {path}")]
    Mkdir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Removing failed.
    #[error("removing {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Renaming failed.
    #[error("renaming {from} to {to}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Sending to the client failed.
    #[error("sending to the client")]
    Send(#[source] FrameError),
}

impl FileError {
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::BadPath(_)
            | Self::BadPerm(_)
            | Self::NoFileName(_)
            | Self::RemoveRefused(_)
            | Self::NotAFile(_) => AgentErrorCode::InvalidInput,
            Self::Exists(_) => AgentErrorCode::Exists,
            Self::Receive(e) | Self::Send(e) => e.code(),
            Self::Stat { source, .. }
            | Self::Open { source, .. }
            | Self::Read { source, .. }
            | Self::Write { source, .. }
            | Self::Commit { source, .. }
            | Self::ListDir { source, .. }
            | Self::Mkdir { source, .. }
            | Self::Remove { source, .. }
            | Self::Rename { source, .. } => AgentErrorCode::from_io(source.kind()),
        }
    }
}

/// An absolute path from a request.
pub fn checked_path(path: &str) -> Result<PathBuf, FileError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(FileError::BadPath(path.to_owned()));
    }
    Ok(PathBuf::from(path))
}

fn kind_of(ft: fs::FileType) -> EntryKind {
    if ft.is_file() {
        EntryKind::File
    } else if ft.is_dir() {
        EntryKind::Dir
    } else if ft.is_symlink() {
        EntryKind::Symlink
    } else {
        EntryKind::Other
    }
}

/// `read_file`: a `file` header, kind-5 frames, an empty kind-5 frame.
pub fn read_file(
    conn: &mut Conn,
    path: &str,
    offset: Option<u64>,
    length: Option<u64>,
) -> Result<(), FileError> {
    use std::os::unix::fs::FileTypeExt;
    let path = checked_path(path)?;
    let stat_err = |source| FileError::Stat {
        path: path.clone(),
        source,
    };
    // Checked before opening (opening a fifo would block), and again on
    // what was opened, without blocking: another guest process may swap
    // a fifo in between.
    let meta = fs::metadata(&path).map_err(stat_err)?;
    let readable = |ft: fs::FileType| ft.is_file() || ft.is_char_device() || ft.is_block_device();
    if !readable(meta.file_type()) {
        return Err(FileError::NotAFile(path));
    }
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .map_err(|source| FileError::Open {
            path: path.clone(),
            source,
        })?;
    let meta = file.metadata().map_err(stat_err)?;
    let ft = meta.file_type();
    if !readable(ft) {
        return Err(FileError::NotAFile(path));
    }
    if !ft.is_file() {
        // A device reads as it would have without O_NONBLOCK.
        clear_nonblock(&file).map_err(|source| FileError::Open {
            path: path.clone(),
            source,
        })?;
    }
    let read_err = |source| FileError::Read {
        path: path.clone(),
        source,
    };
    if let Some(offset) = offset.filter(|&o| o > 0) {
        file.seek(SeekFrom::Start(offset)).map_err(read_err)?;
    }
    let sized = ft.is_file() && meta.len() > 0;
    let mut left = length.unwrap_or(if sized { u64::MAX } else { MAX_UNSIZED_READ });
    conn.send(&Response::File {
        size: meta.len(),
        mode: meta.mode() & 0o7777,
    })
    .map_err(FileError::Send)?;
    let mut out = conn.data_writer();
    let mut buf = vec![0u8; DATA_CHUNK];
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = match file.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_err(e)),
        };
        out.write_all(&buf[..n]).map_err(send_err)?;
        left -= n as u64;
    }
    out.finish().map_err(send_err)
}

fn clear_nonblock(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function's caller owns, with
    // F_GETFL/F_SETFL only.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn send_err(e: io::Error) -> FileError {
    FileError::Send(FrameError::Write(e))
}

/// Removes a temporary file unless disarmed.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// `write_file`: receives the kind-5 stream into the file and answers
/// `ok {bytes}`. `create` and `truncate` write a temporary file beside the
/// target and move it into place only once the whole stream has arrived.
pub fn write_file(
    conn: &mut Conn,
    path: &str,
    mode: WriteMode,
    perm: Option<u32>,
) -> Result<(), FileError> {
    static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);
    let path = checked_path(path)?;
    if let Some(p) = perm.filter(|p| p & !0o7777 != 0) {
        return Err(FileError::BadPerm(p));
    }
    let name = path
        .file_name()
        .ok_or_else(|| FileError::NoFileName(path.clone()))?
        .to_string_lossy()
        .into_owned();
    let open_err = |path: &Path| {
        let path = path.to_owned();
        move |source| FileError::Open { path, source }
    };
    let bytes = match mode {
        WriteMode::Append => {
            let mut file = OpenOptions::new()
                .append(true)
                .create(true)
                .mode(perm.unwrap_or(0o644))
                .open(&path)
                .map_err(open_err(&path))?;
            receive(conn, &mut file, &path)?
        }
        WriteMode::Create | WriteMode::Truncate => {
            let existing = fs::symlink_metadata(&path).ok();
            if mode == WriteMode::Create && existing.is_some() {
                return Err(FileError::Exists(path));
            }
            let perm = perm
                .or(existing.map(|m| m.mode() & 0o7777))
                .unwrap_or(0o644);
            let seq = TEMP_SEQ.fetch_add(1, Ordering::Relaxed);
            // Short enough for NAME_MAX whatever the target's name.
            let stem: String = name.chars().take(100).collect();
            let temp_name = format!(".{stem}.agent-{}-{seq}.tmp", std::process::id());
            let temp_path = path.with_file_name(temp_name);
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp_path)
                .map_err(open_err(&path))?;
            let mut temp = TempFile(Some(temp_path.clone()));
            let bytes = receive(conn, &mut file, &path)?;
            // Exactly `perm`, whatever the umask.
            file.set_permissions(Permissions::from_mode(perm))
                .map_err(|source| FileError::Write {
                    path: path.clone(),
                    source,
                })?;
            drop(file);
            commit(&temp_path, &path, mode)?;
            temp.0 = None;
            bytes
        }
    };
    conn.send(&Response::Ok {
        bytes: Some(bytes),
        entries: None,
    })
    .map_err(FileError::Send)
}

fn receive(conn: &mut Conn, file: &mut File, path: &Path) -> Result<u64, FileError> {
    let mut data = conn.data_reader();
    let mut buf = vec![0u8; DATA_CHUNK];
    let mut total = 0u64;
    loop {
        let n = match data.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) => {
                let failure = data.take_failure().unwrap_or(FrameError::Read(e));
                return Err(FileError::Receive(failure));
            }
        };
        file.write_all(&buf[..n])
            .map_err(|source| FileError::Write {
                path: path.to_owned(),
                source,
            })?;
        total += n as u64;
    }
}

/// Moves the finished temporary file to `path`. For `create` a hard link
/// does it without replacing anything that appeared meanwhile.
fn commit(temp: &Path, path: &Path, mode: WriteMode) -> Result<(), FileError> {
    let commit_err = |source| FileError::Commit {
        path: path.to_owned(),
        source,
    };
    if mode == WriteMode::Create {
        match fs::hard_link(temp, path) {
            Ok(()) => return fs::remove_file(temp).map_err(commit_err),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(FileError::Exists(path.to_owned()))
            }
            // No hard links here (vfat, some FUSE): check, then rename.
            Err(_) if fs::symlink_metadata(path).is_ok() => {
                return Err(FileError::Exists(path.to_owned()))
            }
            Err(_) => {}
        }
    }
    fs::rename(temp, path).map_err(commit_err)
}

/// `stat` (symlinks are not followed).
pub fn stat(path: &str) -> Result<Response, FileError> {
    let path = checked_path(path)?;
    let meta = fs::symlink_metadata(&path).map_err(|source| FileError::Stat { path, source })?;
    Ok(Response::Stat(StatAnswer {
        kind: kind_of(meta.file_type()),
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        mtime_s: meta.mtime(),
        uid: meta.uid(),
        gid: meta.gid(),
    }))
}

/// `list_dir`: up to [`MAX_DIR_ENTRIES`] entries sorted by name.
pub fn list_dir(path: &str) -> Result<Response, FileError> {
    let path = checked_path(path)?;
    let list_err = |source| FileError::ListDir {
        path: path.clone(),
        source,
    };
    let mut entries = Vec::new();
    let mut truncated = false;
    for entry in fs::read_dir(&path).map_err(list_err)? {
        let entry = entry.map_err(list_err)?;
        if entries.len() == MAX_DIR_ENTRIES {
            truncated = true;
            break;
        }
        // An entry removed meanwhile is skipped.
        let Ok(meta) = entry.metadata() else { continue };
        entries.push(ListedEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            kind: kind_of(meta.file_type()),
            size: meta.len(),
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Response::Entries { entries, truncated })
}

/// `mkdir` (with parents; an existing directory is fine).
pub fn mkdir(path: &str) -> Result<Response, FileError> {
    let path = checked_path(path)?;
    fs::create_dir_all(&path).map_err(|source| FileError::Mkdir { path, source })?;
    Ok(Response::ok())
}

/// `remove`: a file or symlink, an empty directory, or with `recursive` a
/// whole tree.
pub fn remove(path: &str, recursive: bool) -> Result<Response, FileError> {
    let path = checked_path(path)?;
    if path.parent().is_none() || path.components().any(|c| c == Component::ParentDir) {
        return Err(FileError::RemoveRefused(path));
    }
    let remove_err = |source| FileError::Remove {
        path: path.clone(),
        source,
    };
    let meta = fs::symlink_metadata(&path).map_err(remove_err)?;
    let removed = if !meta.is_dir() {
        fs::remove_file(&path)
    } else if recursive {
        fs::remove_dir_all(&path)
    } else {
        fs::remove_dir(&path)
    };
    removed.map_err(remove_err)?;
    Ok(Response::ok())
}

/// `rename`.
pub fn rename(from: &str, to: &str) -> Result<Response, FileError> {
    let (from, to) = (checked_path(from)?, checked_path(to)?);
    fs::rename(&from, &to).map_err(|source| FileError::Rename { from, to, source })?;
    Ok(Response::ok())
}
