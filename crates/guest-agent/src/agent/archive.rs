//! tar_out and tar_in: a directory as a tar stream over kind-5 frames.

use std::fs;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};

use guest_agent::frame::FrameError;
use guest_agent::protocol::{AgentErrorCode, Response};

use super::conn::Conn;
use super::files::checked_path;

/// Most entries one `tar_in` extracts.
const MAX_TAR_ENTRIES: u64 = 1_000_000;

/// Why a tar operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// Not an absolute path.
    #[error("{0:?} is not an absolute path without NUL bytes")]
    BadPath(String),
    /// `tar_out` of something that is not a directory.
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    /// Looking at the source directory failed.
    #[error("stat {path}")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Creating the archive failed (reading the tree or sending it).
    #[error("archiving {path}")]
    Build {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Creating the target directory failed.
    #[error("creating {path}")]
    Mkdir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An entry is absolute or has a `..` component.
    #[error("tar entry {0:?} would land outside the target directory")]
    Escapes(String),
    /// More than [`MAX_TAR_ENTRIES`] entries.
    #[error("the archive has more than {MAX_TAR_ENTRIES} entries")]
    TooManyEntries,
    /// Receiving the archive from the client failed.
    #[error("receiving the archive")]
    Receive(#[source] FrameError),
    /// The archive is malformed or an entry could not be written.
    #[error("extracting into {path}")]
    Extract {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Sending the answer failed.
    #[error("sending to the client")]
    Send(#[source] FrameError),
}

impl ArchiveError {
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::BadPath(_) | Self::NotADirectory(_) | Self::Escapes(_) => {
                AgentErrorCode::InvalidInput
            }
            Self::TooManyEntries => AgentErrorCode::TooLarge,
            Self::Receive(e) | Self::Send(e) => e.code(),
            Self::Stat { source, .. }
            | Self::Build { source, .. }
            | Self::Mkdir { source, .. }
            | Self::Extract { source, .. } => AgentErrorCode::from_io(source.kind()),
        }
    }
}

fn checked(path: &str) -> Result<PathBuf, ArchiveError> {
    checked_path(path).map_err(|_| ArchiveError::BadPath(path.to_owned()))
}

/// `tar_out`: the directory's tree (names relative to it, symlinks as
/// symlinks, sockets skipped, sorted by name) as kind-5 frames, then an
/// empty one; with `one_file_system`, directories of other filesystems
/// (mount points) are archived without their contents.
pub fn tar_out(conn: &mut Conn, path: &str, one_file_system: bool) -> Result<(), ArchiveError> {
    let root = checked(path)?;
    let meta = fs::metadata(&root).map_err(|source| ArchiveError::Stat {
        path: root.clone(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(ArchiveError::NotADirectory(root));
    }
    let build_err = |source| ArchiveError::Build {
        path: root.clone(),
        source,
    };
    let mut out = conn.data_writer();
    {
        let mut builder = tar::Builder::new(&mut out);
        builder.follow_symlinks(false);
        // Whole contents, holes as zeros: the host counts every byte it
        // takes against its limits, and its unpackers write plain files.
        // (GNU sparse entries would let a tebibyte file pass as a few
        // bytes, and were dropped by the image conversion.)
        builder.sparse(false);
        let device = one_file_system.then(|| std::os::unix::fs::MetadataExt::dev(&meta));
        append_tree(&mut builder, &root, device).map_err(build_err)?;
        builder.finish().map_err(build_err)?;
    }
    out.finish().map_err(build_err)
}

/// Appends everything below `root`; with `device`, the contents of
/// directories on another device are left out (the directory stays).
fn append_tree<W: Write>(
    builder: &mut tar::Builder<W>,
    root: &Path,
    device: Option<u64>,
) -> io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let mut entries = fs::read_dir(root.join(&rel))?.collect::<Result<Vec<_>, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for entry in entries {
            let ft = entry.file_type()?;
            if ft.is_socket() {
                continue;
            }
            let name = rel.join(entry.file_name());
            builder.append_path_with_name(entry.path(), &name)?;
            let same_fs = match device {
                Some(dev) => entry.metadata()?.dev() == dev,
                None => true,
            };
            if ft.is_dir() && same_fs {
                subdirs.push(name);
            }
        }
        dirs.extend(subdirs.into_iter().rev());
    }
    Ok(())
}

/// `tar_in`: extracts the kind-5 tar stream under `path` (created if
/// missing) and answers `ok {entries}`. An entry that is absolute or has a
/// `..` component stops the extraction with INVALID_INPUT; what was
/// extracted before it stays. With `owners`, entries keep the archive's
/// owner and group.
pub fn tar_in(conn: &mut Conn, path: &str, owners: bool) -> Result<(), ArchiveError> {
    let root = checked(path)?;
    fs::create_dir_all(&root).map_err(|source| ArchiveError::Mkdir {
        path: root.clone(),
        source,
    })?;
    let extract_err = |source| ArchiveError::Extract {
        path: root.clone(),
        source,
    };
    let mut data = conn.data_reader();
    let mut count = 0u64;
    let extracted = (|| {
        let mut archive = tar::Archive::new(&mut data);
        archive.set_preserve_permissions(true);
        archive.set_preserve_mtime(true);
        archive.set_preserve_ownerships(owners);
        archive.set_overwrite(true);
        for entry in archive.entries().map_err(extract_err)? {
            let mut entry = entry.map_err(extract_err)?;
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let escapes = entry.path().map_err(extract_err)?.components().any(|c| {
                matches!(
                    c,
                    Component::RootDir | Component::ParentDir | Component::Prefix(_)
                )
            });
            if escapes {
                return Err(ArchiveError::Escapes(name));
            }
            count += 1;
            if count > MAX_TAR_ENTRIES {
                return Err(ArchiveError::TooManyEntries);
            }
            // unpack_in also refuses to write through a symlink that leads
            // outside `root`.
            if !entry.unpack_in(&root).map_err(extract_err)? {
                return Err(ArchiveError::Escapes(name));
            }
        }
        Ok(())
    })();
    if let Err(e) = extracted {
        // A frame-level failure underneath says more than tar's message.
        return Err(match data.take_failure() {
            Some(failure) => ArchiveError::Receive(failure),
            None => e,
        });
    }
    // The archive's end marker may come before the end of the stream.
    data.drain()
        .map_err(|e| ArchiveError::Receive(data.take_failure().unwrap_or(FrameError::Read(e))))?;
    conn.send(&Response::Ok {
        bytes: None,
        entries: Some(count),
    })
    .map_err(ArchiveError::Send)
}
