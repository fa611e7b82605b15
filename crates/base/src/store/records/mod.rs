//! One store of named records in the state directory: a directory with a
//! file per record (`<dir>/<name>.json`), or a folder per record that
//! holds more than the record (`<dir>/<name>/<file>`). Names are checked
//! before any path is made of them, a write is atomic (temporary file,
//! fsync, rename), a missing record reads as `None`, and a read is bounded.
//! Agents, repositories, secrets, volumes, tasks and servers keep their
//! records here; what each store adds is its own policy and errors.

use std::fs::{Metadata, OpenOptions};
use std::io::Read;
use std::marker::PhantomData;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::code::ErrorCode;
use crate::host::settings::unique_id;
use crate::store::file_lock::FileLock;
use crate::store::{json_file_bytes, make_private_dir, write_file_atomic, StoreError};

#[cfg(test)]
mod tests;

/// Largest record read, bytes: a record is metadata, and a bigger file in
/// the state directory is damage, not a record.
pub const MAX_RECORD_BYTES: u64 = 1 << 20;

/// Longest part of a refused name an error repeats.
const NAME_SHOWN: usize = 80;

/// Where a record lives under the store's directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordLayout {
    /// `<dir>/<name><suffix>` (suffix `.json`, or empty).
    File(&'static str),
    /// `<dir>/<name>/<file>`: a folder per record, holding other files too.
    Folder(&'static str),
}

/// Why a record could not be read, written, listed or removed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The name fails the store's check; no path was made of it.
    #[error("invalid record name {name:?}")]
    Name {
        /// The name given (its first characters).
        name: String,
    },
    /// The store's directory could not be listed.
    #[error("cannot list {}", dir.display())]
    List {
        /// The directory.
        dir: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A record could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The record's file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A record's path holds something other than a regular file.
    #[error("{} is not a regular file", path.display())]
    NotAFile {
        /// The record's path.
        path: PathBuf,
    },
    /// A record is over the store's size bound; it was not read.
    #[error("{} is larger than {limit} bytes", path.display())]
    TooLarge {
        /// The record's file.
        path: PathBuf,
        /// The bound.
        limit: u64,
    },
    /// A record is not the JSON expected.
    #[error("{} is damaged (not the expected JSON)", path.display())]
    Parse {
        /// The record's file.
        path: PathBuf,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
    /// A record could not be added under its name.
    #[error("cannot add {}", path.display())]
    Link {
        /// The record's file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A record could not be removed.
    #[error("cannot remove {}", path.display())]
    Remove {
        /// The record's path.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A record's lock could not be taken.
    #[error("cannot lock {}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A directory could not be made or a file written.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl RecordError {
    /// The stable code front ends report.
    pub fn code(&self) -> ErrorCode {
        match self {
            RecordError::Name { .. } => ErrorCode::InvalidInput,
            RecordError::Store(e) => e.code(),
            _ => ErrorCode::Internal,
        }
    }
}

/// Whether `e` says the path is not there (also: a part of it that should
/// be a folder is a file).
fn is_missing(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

/// A directory of records as bytes.
#[derive(Clone, Debug)]
pub struct RecordFiles {
    dir: PathBuf,
    layout: RecordLayout,
    check: fn(&str) -> bool,
    max_bytes: u64,
}

impl RecordFiles {
    /// The records in `dir` laid out as `layout`; a name is used only when
    /// `check` accepts it (it must refuse `/`, `.` and `..`). Reads are
    /// bounded by [`MAX_RECORD_BYTES`].
    pub fn new(dir: impl Into<PathBuf>, layout: RecordLayout, check: fn(&str) -> bool) -> Self {
        Self {
            dir: dir.into(),
            layout,
            check,
            max_bytes: MAX_RECORD_BYTES,
        }
    }

    /// The same records with reads bounded by `limit` bytes.
    pub fn max_bytes(mut self, limit: u64) -> Self {
        self.max_bytes = limit;
        self
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn checked<'a>(&self, name: &'a str) -> Result<&'a str, RecordError> {
        // A leading dot marks temporaries and leftovers, never a record.
        if name.starts_with('.') || name.contains('/') || !(self.check)(name) {
            return Err(RecordError::Name {
                name: name.chars().take(NAME_SHOWN).collect(),
            });
        }
        Ok(name)
    }

    /// Where record `name` lives: its file, or its folder.
    pub fn home(&self, name: &str) -> Result<PathBuf, RecordError> {
        let name = self.checked(name)?;
        Ok(match self.layout {
            RecordLayout::File(suffix) => self.dir.join(format!("{name}{suffix}")),
            RecordLayout::Folder(_) => self.dir.join(name),
        })
    }

    /// Record `name`'s file.
    pub fn file(&self, name: &str) -> Result<PathBuf, RecordError> {
        let home = self.home(name)?;
        Ok(match self.layout {
            RecordLayout::File(_) => home,
            RecordLayout::Folder(file) => home.join(file),
        })
    }

    /// The lock [`RecordStore::update`] takes: `<name>.lock` beside a
    /// record file, `<stem>.lock` in a record's folder.
    fn lock_file(&self, name: &str) -> Result<PathBuf, RecordError> {
        let home = self.home(name)?;
        Ok(match self.layout {
            RecordLayout::File(_) => self.dir.join(format!("{name}.lock")),
            RecordLayout::Folder(file) => {
                let stem = file.rsplit_once('.').map_or(file, |(stem, _)| stem);
                home.join(format!("{stem}.lock"))
            }
        })
    }

    /// Record `name`'s bytes; `None` when there is none. A file over the
    /// bound is refused without reading it; a link is not followed.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, RecordError> {
        let path = self.file(name)?;
        let read_err = |source| RecordError::Read {
            path: path.clone(),
            source,
        };
        // O_NONBLOCK: a FIFO planted here must not hang the read.
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if is_missing(&e) => return Ok(None),
            Err(e) => return Err(read_err(e)),
        };
        let meta = file.metadata().map_err(read_err)?;
        if !meta.is_file() {
            return Err(RecordError::NotAFile { path });
        }
        let too_large = || RecordError::TooLarge {
            path: path.clone(),
            limit: self.max_bytes,
        };
        if meta.len() > self.max_bytes {
            return Err(too_large());
        }
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        // One byte past the bound tells a file that grew since the stat.
        file.take(self.max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        if bytes.len() as u64 > self.max_bytes {
            return Err(too_large());
        }
        Ok(Some(bytes))
    }

    /// What the file system says of record `name`'s file (a link is not
    /// followed); `None` when there is none.
    pub fn metadata(&self, name: &str) -> Result<Option<Metadata>, RecordError> {
        let path = self.file(name)?;
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => Ok(Some(meta)),
            Err(e) if is_missing(&e) => Ok(None),
            Err(source) => Err(RecordError::Read { path, source }),
        }
    }

    /// Makes the directories record `name`'s file goes in (mode 0700).
    fn make_home(&self, name: &str) -> Result<PathBuf, RecordError> {
        let file = self.file(name)?;
        make_private_dir(&self.dir)?;
        if let RecordLayout::Folder(_) = self.layout {
            make_private_dir(&self.home(name)?)?;
        }
        Ok(file)
    }

    /// Sets record `name` to `bytes` (mode 0600): a crash leaves the old
    /// record or the new one, never a mix.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<(), RecordError> {
        let file = self.make_home(name)?;
        write_file_atomic(&file, bytes)?;
        Ok(())
    }

    /// Adds record `name` as `bytes` unless it exists: `false`, and nothing
    /// written, when it does. Two adds of one name never both succeed.
    pub fn create(&self, name: &str, bytes: &[u8]) -> Result<bool, RecordError> {
        let file = self.make_home(name)?;
        let parent = file.parent().unwrap_or(&self.dir);
        let tmp = parent.join(format!(".new-{name}-{}", unique_id()));
        write_file_atomic(&tmp, bytes)?;
        // A hard link fails when the name exists: the add is atomic.
        let linked = std::fs::hard_link(&tmp, &file);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
            Err(source) => return Err(RecordError::Link { path: file, source }),
        }
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|source| RecordError::Link { path: file, source })?;
        Ok(true)
    }

    /// Removes record `name` (a folder is renamed aside first, so a crash
    /// never leaves half a record); `false` when there was none.
    pub fn remove(&self, name: &str) -> Result<bool, RecordError> {
        let home = self.home(name)?;
        let removed = match self.layout {
            RecordLayout::File(_) => std::fs::remove_file(&home),
            RecordLayout::Folder(_) => {
                let doomed = self.dir.join(format!(".gone-{name}-{}", unique_id()));
                std::fs::rename(&home, &doomed).inspect(|()| {
                    if let Err(e) = std::fs::remove_dir_all(&doomed) {
                        tracing::warn!("leaving {}: {e}", doomed.display());
                    }
                })
            }
        };
        match removed {
            Ok(()) => Ok(true),
            Err(e) if is_missing(&e) => Ok(false),
            Err(source) => Err(RecordError::Remove { path: home, source }),
        }
    }

    /// Takes record `name`'s lock, waiting for another holder.
    fn lock(&self, name: &str) -> Result<Option<FileLock>, RecordError> {
        let path = self.lock_file(name)?;
        match FileLock::exclusive(&path) {
            Ok(lock) => Ok(Some(lock)),
            Err(e) if is_missing(&e) => Ok(None),
            Err(source) => Err(RecordError::Lock { path, source }),
        }
    }

    /// The names of the records, sorted; none when the directory does not
    /// exist. Temporaries, leftovers, links and names the check refuses
    /// are passed over.
    pub fn names(&self) -> Result<Vec<String>, RecordError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if is_missing(&e) => return Ok(Vec::new()),
            Err(source) => {
                return Err(RecordError::List {
                    dir: self.dir.clone(),
                    source,
                })
            }
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|entry| {
                let file_name = entry.file_name().into_string().ok()?;
                let kind = entry.file_type().ok()?;
                let name = match self.layout {
                    RecordLayout::File(suffix) if kind.is_file() => {
                        file_name.strip_suffix(suffix)?
                    }
                    RecordLayout::Folder(_) if kind.is_dir() => &file_name,
                    _ => return None,
                };
                self.checked(name).ok().map(str::to_owned)
            })
            .collect();
        names.sort();
        Ok(names)
    }
}

/// A directory of records of type `T`, each kept as JSON.
pub struct RecordStore<T> {
    files: RecordFiles,
    record: PhantomData<fn() -> T>,
}

impl<T> Clone for RecordStore<T> {
    fn clone(&self) -> Self {
        Self {
            files: self.files.clone(),
            record: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for RecordStore<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordStore")
            .field("files", &self.files)
            .finish()
    }
}

impl<T: Serialize + DeserializeOwned> RecordStore<T> {
    /// The JSON records in `dir`, as [`RecordFiles::new`] lays them out.
    pub fn new(dir: impl Into<PathBuf>, layout: RecordLayout, check: fn(&str) -> bool) -> Self {
        Self {
            files: RecordFiles::new(dir, layout, check),
            record: PhantomData,
        }
    }

    /// The records as files.
    pub fn files(&self) -> &RecordFiles {
        &self.files
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        self.files.dir()
    }

    /// Record `name`; `None` when there is none.
    pub fn get(&self, name: &str) -> Result<Option<T>, RecordError> {
        let path = self.files.file(name)?;
        let Some(bytes) = self.files.read(name)? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| RecordError::Parse { path, source })
    }

    fn bytes(&self, name: &str, value: &T) -> Result<Vec<u8>, RecordError> {
        let path = self.files.file(name)?;
        json_file_bytes(value).map_err(|e| {
            RecordError::Store(StoreError::Write {
                path,
                source: std::io::Error::other(e),
            })
        })
    }

    /// Sets record `name` to `value`, atomically.
    pub fn put(&self, name: &str, value: &T) -> Result<(), RecordError> {
        self.files.write(name, &self.bytes(name, value)?)
    }

    /// Adds record `name` unless it exists (`false` then).
    pub fn create(&self, name: &str, value: &T) -> Result<bool, RecordError> {
        self.files.create(name, &self.bytes(name, value)?)
    }

    /// Changes record `name` under its lock and returns it as changed;
    /// `None` when there is none.
    pub fn update(
        &self,
        name: &str,
        change: impl FnOnce(&mut T),
    ) -> Result<Option<T>, RecordError> {
        let Some(_lock) = self.files.lock(name)? else {
            return Ok(None);
        };
        let Some(mut value) = self.get(name)? else {
            return Ok(None);
        };
        change(&mut value);
        self.put(name, &value)?;
        Ok(Some(value))
    }

    /// Removes record `name`; `false` when there was none.
    pub fn remove(&self, name: &str) -> Result<bool, RecordError> {
        self.files.remove(name)
    }

    /// The names of the records, sorted.
    pub fn names(&self) -> Result<Vec<String>, RecordError> {
        self.files.names()
    }
}
