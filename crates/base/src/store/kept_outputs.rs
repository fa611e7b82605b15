//! Outputs kept on the host: a file a command left that was past the
//! inline caps is copied to `<state>/outputs/<workspace>/<call>/`. A guest
//! chooses these files, so they are bounded: a quota per call, per
//! workspace and for all workspaces, counted by the disk the files take
//! (holes a guest sends stay holes: [`SparseWriter`]); refused when over,
//! leaving nothing of the call behind; removed with their workspace and
//! after a TTL (swept when outputs are next kept, and on delete: no
//! daemon). Limits come from `config.json`'s `outputs` object.

use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::code::ErrorCode;

/// Where kept outputs are, in the state directory.
pub const OUTPUTS_DIR: &str = "outputs";
/// The `config.json` object of their limits.
pub const CONFIG_KEY: &str = "outputs";
/// Default most bytes one call keeps.
pub const DEFAULT_MAX_CALL_BYTES: u64 = 256 << 20;
/// Default most bytes one workspace's kept outputs take.
pub const DEFAULT_MAX_WORKSPACE_BYTES: u64 = 1 << 30;
/// Default most bytes all kept outputs take.
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 4 << 30;
/// Default age after which kept outputs are removed, seconds (7 days).
pub const DEFAULT_TTL_SECS: u64 = 7 * 24 * 3600;
/// The block a hole is kept at: a block of zeros is not written.
const BLOCK: usize = 4096;

/// The quota a keep would pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Quota {
    /// One call's.
    Call,
    /// One workspace's.
    Workspace(String),
    /// All workspaces'.
    Total,
}

impl std::fmt::Display for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Quota::Call => f.write_str("the per-call quota (outputs.max_call_bytes)"),
            Quota::Workspace(w) => {
                write!(f, "workspace `{w}`'s quota (outputs.max_workspace_bytes)")
            }
            Quota::Total => f.write_str("the quota of all kept outputs (outputs.max_total_bytes)"),
        }
    }
}

/// Why outputs were not kept.
#[derive(Debug, thiserror::Error)]
pub enum KeptOutputsError {
    /// Keeping them would pass a quota; nothing of the call was kept.
    #[error("outputs kept on the host would take {would_take} bytes, over {quota} of {limit} bytes; nothing was kept: ask for fewer or smaller files, or copy them out; kept outputs go with their workspace and after {ttl_days} day(s)")]
    OverQuota {
        /// Which.
        quota: Quota,
        /// Its limit, bytes.
        limit: u64,
        /// What they would take, bytes.
        would_take: u64,
        /// Their TTL, days.
        ttl_days: u64,
    },
    /// `config.json`'s `outputs` is not valid.
    #[error("reading the outputs settings")]
    Config(#[source] crate::host::settings::ConfigError),
    /// Their directory could not be made.
    #[error("making the directory of kept outputs")]
    Store(#[source] crate::store::StoreError),
    /// A host file operation failed.
    #[error("{what}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

impl KeptOutputsError {
    /// The stable code front ends report: a call over its own quota is a
    /// request too big; one over a quota others fill clashes with state.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::OverQuota {
                quota: Quota::Call, ..
            } => ErrorCode::InvalidInput,
            Self::OverQuota { .. } => ErrorCode::Conflict,
            Self::Config(_) => ErrorCode::InvalidInput,
            Self::Store(_) | Self::Io { .. } => ErrorCode::Internal,
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> KeptOutputsError {
    let what = what.into();
    move |source| KeptOutputsError::Io { what, source }
}

/// `config.json`'s `outputs` object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputLimits {
    /// Most bytes one call keeps.
    #[serde(default = "d_call")]
    pub max_call_bytes: u64,
    /// Most bytes one workspace's kept outputs take.
    #[serde(default = "d_workspace")]
    pub max_workspace_bytes: u64,
    /// Most bytes all kept outputs take.
    #[serde(default = "d_total")]
    pub max_total_bytes: u64,
    /// Age after which they are removed, seconds.
    #[serde(default = "d_ttl")]
    pub ttl_secs: u64,
}

fn d_call() -> u64 {
    DEFAULT_MAX_CALL_BYTES
}
fn d_workspace() -> u64 {
    DEFAULT_MAX_WORKSPACE_BYTES
}
fn d_total() -> u64 {
    DEFAULT_MAX_TOTAL_BYTES
}
fn d_ttl() -> u64 {
    DEFAULT_TTL_SECS
}

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            max_call_bytes: DEFAULT_MAX_CALL_BYTES,
            max_workspace_bytes: DEFAULT_MAX_WORKSPACE_BYTES,
            max_total_bytes: DEFAULT_MAX_TOTAL_BYTES,
            ttl_secs: DEFAULT_TTL_SECS,
        }
    }
}

impl OutputLimits {
    /// The limits of the state directory at `root`.
    pub fn load(root: &Path) -> Result<Self, KeptOutputsError> {
        Ok(crate::host::settings::config_section(root, CONFIG_KEY)
            .map_err(KeptOutputsError::Config)?
            .map(|(limits, _)| limits)
            .unwrap_or_default())
    }
}

/// The kept outputs of one state directory.
#[derive(Clone, Debug)]
pub struct KeptOutputs {
    dir: PathBuf,
    limits: OutputLimits,
}

impl KeptOutputs {
    /// Those of the state directory at `root`, with its limits.
    pub fn new(root: &Path) -> Result<Self, KeptOutputsError> {
        Ok(Self::with_limits(root, OutputLimits::load(root)?))
    }

    /// Those of `root`, with `limits`.
    pub fn with_limits(root: &Path, limits: OutputLimits) -> Self {
        Self {
            dir: root.join(OUTPUTS_DIR),
            limits,
        }
    }

    /// Their limits.
    pub fn limits(&self) -> OutputLimits {
        self.limits
    }

    /// Workspace `name`'s directory (`name` is a checked full name).
    pub fn workspace_dir(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Disk all kept outputs take, bytes.
    pub fn total_bytes(&self) -> u64 {
        disk_usage(&self.dir, 3)
    }

    /// Removes workspace `name`'s kept outputs.
    pub fn remove_workspace(&self, name: &str) -> Result<(), KeptOutputsError> {
        let dir = self.workspace_dir(name);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(io_err(format!("removing {}", dir.display()))(e))
            }
            _ => Ok(()),
        }
    }

    /// Removes what is older than the TTL; the bytes freed. Failures are
    /// logged: a sweep is housekeeping, never the caller's failure.
    pub fn sweep(&self) -> u64 {
        self.sweep_at(SystemTime::now())
    }

    fn sweep_at(&self, now: SystemTime) -> u64 {
        let ttl = Duration::from_secs(self.limits.ttl_secs);
        let Ok(workspaces) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut freed = 0;
        for ws in workspaces.flatten() {
            let ws = ws.path();
            if !std::fs::symlink_metadata(&ws).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            // Each call's directory (or, as kept before, each file).
            for call in std::fs::read_dir(&ws).into_iter().flatten().flatten() {
                let path = call.path();
                let Ok(meta) = std::fs::symlink_metadata(&path) else {
                    continue;
                };
                let old = meta
                    .modified()
                    .ok()
                    .and_then(|m| now.duration_since(m).ok())
                    .is_some_and(|age| age > ttl);
                if !old {
                    continue;
                }
                let size = disk_usage(&path, 2);
                let removed = if meta.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                match removed {
                    Ok(()) => freed += size,
                    Err(e) => tracing::warn!("removing expired output {}: {e}", path.display()),
                }
            }
            // Gone when empty (fails harmlessly otherwise).
            let _ = std::fs::remove_dir(&ws);
        }
        freed
    }

    /// Starts one call's keeping for workspace `name`: what its workspace
    /// and all workspaces keep now is measured once. Its files are written
    /// in a hidden directory, renamed to the call's when it finishes.
    pub fn begin(&self, name: &str) -> KeepCall {
        let workspace_dir = self.workspace_dir(name);
        let id = format!(
            "{}-{}",
            crate::host::settings::now_ms(),
            crate::host::dirfd::random_hex()
        );
        KeepCall {
            dir: workspace_dir.join(format!(".{id}.part")),
            done: workspace_dir.join(id),
            workspace: name.to_owned(),
            workspace_before: disk_usage(&workspace_dir, 2),
            total_before: self.total_bytes(),
            used: 0,
            limits: self.limits,
            made: false,
            outputs: self.dir.clone(),
        }
    }
}

/// One call's kept outputs, removed unless [`KeepCall::finish`]ed.
#[derive(Debug)]
pub struct KeepCall {
    /// Where its files are written.
    dir: PathBuf,
    /// Where they are once it finishes.
    done: PathBuf,
    workspace: String,
    workspace_before: u64,
    total_before: u64,
    used: u64,
    limits: OutputLimits,
    made: bool,
    outputs: PathBuf,
}

impl KeepCall {
    /// Where file `file_name` of this call is written (the call's
    /// directory is made on first use); [`KeepCall::finish`] says where it
    /// is kept.
    pub fn path_for(&mut self, file_name: &str) -> Result<PathBuf, KeptOutputsError> {
        if !self.made {
            let workspace = self.dir.parent().unwrap_or(&self.outputs).to_owned();
            for dir in [&self.outputs, &workspace, &self.dir] {
                crate::store::make_private_dir(dir).map_err(KeptOutputsError::Store)?;
            }
            self.made = true;
        }
        Ok(self.dir.join(file_name))
    }

    /// Bytes of disk the next file may take, and the quota that bounds it.
    pub fn room(&self) -> (u64, Quota) {
        let l = &self.limits;
        [
            (l.max_call_bytes.saturating_sub(self.used), Quota::Call),
            (
                l.max_workspace_bytes
                    .saturating_sub(self.workspace_before + self.used),
                Quota::Workspace(self.workspace.clone()),
            ),
            (
                l.max_total_bytes
                    .saturating_sub(self.total_before + self.used),
                Quota::Total,
            ),
        ]
        .into_iter()
        .min_by_key(|(room, _)| *room)
        .unwrap_or((0, Quota::Call))
    }

    /// The refusal for `quota` when `more` bytes were to be added.
    pub fn over(&self, quota: Quota, more: u64) -> KeptOutputsError {
        let l = &self.limits;
        let (limit, would_take) = match quota {
            Quota::Call => (l.max_call_bytes, self.used.saturating_add(more)),
            Quota::Workspace(_) => (
                l.max_workspace_bytes,
                (self.workspace_before + self.used).saturating_add(more),
            ),
            Quota::Total => (
                l.max_total_bytes,
                (self.total_before + self.used).saturating_add(more),
            ),
        };
        KeptOutputsError::OverQuota {
            quota,
            limit,
            would_take,
            ttl_days: l.ttl_secs.div_ceil(24 * 3600),
        }
    }

    /// Counts the file kept at `path` by the disk it takes (what was
    /// written may take more or less than its size); refused when that
    /// passes a quota.
    pub fn add(&mut self, path: &Path) -> Result<u64, KeptOutputsError> {
        let taken = disk_usage(path, 0);
        let (room, quota) = self.room();
        if taken > room {
            return Err(self.over(quota, taken));
        }
        self.used += taken;
        Ok(taken)
    }

    /// Keeps the call's files: measured again, under a lock, with what
    /// other calls finished meanwhile, and removed (refused) when the
    /// workspace's or the total quota is passed after all; else moved to
    /// the call's directory, which it returns (`None`: nothing was kept).
    pub fn finish(mut self) -> Result<Option<PathBuf>, KeptOutputsError> {
        if !self.made {
            return Ok(None);
        }
        let l = self.limits;
        let lock_path = self.outputs.join(".lock");
        let _lock = crate::store::file_lock::FileLock::exclusive(&lock_path)
            .map_err(io_err(format!("locking {}", lock_path.display())))?;
        // Hidden entries (calls not finished, partial files) do not count.
        let mine = disk_usage(&self.dir, 1);
        let workspace = disk_usage(self.dir.parent().unwrap_or(&self.dir), 2) + mine;
        let total = disk_usage(&self.outputs, 3) + mine;
        let over = if workspace > l.max_workspace_bytes {
            Some((
                Quota::Workspace(self.workspace.clone()),
                l.max_workspace_bytes,
                workspace,
            ))
        } else if total > l.max_total_bytes {
            Some((Quota::Total, l.max_total_bytes, total))
        } else {
            None
        };
        if let Some((quota, limit, would_take)) = over {
            return Err(KeptOutputsError::OverQuota {
                quota,
                limit,
                would_take,
                ttl_days: l.ttl_secs.div_ceil(24 * 3600),
            });
        }
        std::fs::rename(&self.dir, &self.done)
            .map_err(io_err(format!("keeping {}", self.done.display())))?;
        // Kept: not removed when dropped.
        self.made = false;
        Ok(Some(self.done.clone()))
    }
}

impl Drop for KeepCall {
    fn drop(&mut self) {
        if self.made {
            let _ = std::fs::remove_dir_all(&self.dir);
            if let Some(parent) = self.dir.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

/// Disk taken below `path` (st_blocks), `depth` levels of directories
/// down; symlinks are not followed, and hidden entries below it (calls
/// not finished, partial files, the lock) are not counted.
pub fn disk_usage(path: &Path, depth: u32) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.blocks() * 512;
    }
    if depth == 0 {
        return 0;
    }
    std::fs::read_dir(path)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
        .map(|e| disk_usage(&e.path(), depth - 1))
        .sum()
}

/// A writer into a host file that keeps holes: a block of zeros is
/// skipped, not written, so a sparse guest file stays sparse. It refuses
/// once the blocks it wrote pass `room` bytes.
#[derive(Debug)]
pub struct SparseWriter {
    file: std::fs::File,
    /// Where the pending block starts.
    at: u64,
    pending: Vec<u8>,
    written: u64,
    room: u64,
    over: bool,
}

impl SparseWriter {
    /// Writes into `file` from its start, at most `room` bytes of blocks.
    pub fn new(file: std::fs::File, room: u64) -> Self {
        Self {
            file,
            at: 0,
            pending: Vec::with_capacity(BLOCK),
            written: 0,
            room,
            over: false,
        }
    }

    /// Whether a write was refused for the room.
    pub fn over(&self) -> bool {
        self.over
    }

    /// Bytes of blocks written.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Takes `buf`; the bytes taken.
    pub fn take(&mut self, mut buf: &[u8]) -> io::Result<usize> {
        let n = buf.len();
        while !buf.is_empty() {
            let want = BLOCK - self.pending.len();
            let (now, rest) = buf.split_at(want.min(buf.len()));
            self.pending.extend_from_slice(now);
            buf = rest;
            if self.pending.len() == BLOCK {
                self.flush_block()?;
            }
        }
        Ok(n)
    }

    fn flush_block(&mut self) -> io::Result<()> {
        if self.pending.iter().any(|b| *b != 0) {
            let len = self.pending.len() as u64;
            if self.written + len > self.room {
                self.over = true;
                return Err(io::Error::other("over the kept outputs' quota"));
            }
            self.file.write_all_at(&self.pending, self.at)?;
            self.written += len;
        }
        self.at += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// Writes what is pending and gives the file its full length (a hole
    /// at its end too); the file's length.
    pub fn finish(&mut self) -> io::Result<u64> {
        if !self.pending.is_empty() {
            self.flush_block()?;
        }
        self.file.set_len(self.at)?;
        Ok(self.at)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ma-kept-{tag}-{}",
            crate::host::settings::unique_id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn limits(call: u64, workspace: u64, total: u64) -> OutputLimits {
        OutputLimits {
            max_call_bytes: call,
            max_workspace_bytes: workspace,
            max_total_bytes: total,
            ttl_secs: DEFAULT_TTL_SECS,
        }
    }

    /// Writes `data` through a [`SparseWriter`] of `room` into a call's
    /// file, as `collect_outputs` does; the file's path.
    fn keep(call: &mut KeepCall, name: &str, data: &[u8]) -> Result<u64, KeptOutputsError> {
        let path = call.path_for(name).unwrap();
        let file = std::fs::File::create(&path).unwrap();
        let mut w = SparseWriter::new(file, call.room().0);
        for chunk in data.chunks(10_000) {
            if w.take(chunk).is_err() {
                assert!(w.over());
                let (_, quota) = call.room();
                return Err(call.over(quota, w.written() + BLOCK as u64));
            }
        }
        w.finish().unwrap();
        call.add(&path)
    }

    #[test]
    fn a_sparse_file_counts_by_the_disk_it_takes() {
        let root = scratch("sparse");
        let kept = KeptOutputs::with_limits(&root, limits(1 << 20, 1 << 20, 1 << 20));
        let mut call = kept.begin("ws");
        // 64 MiB with 8 KiB of data: far over every quota by its size.
        let mut data = vec![0u8; 64 << 20];
        data[..5000].fill(b'a');
        data[(32 << 20)..(32 << 20) + 10].fill(b'b');
        let taken = keep(&mut call, "0-sparse", &data).unwrap();
        let path = call.dir.join("0-sparse");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 64 << 20, "its size is kept");
        assert!(taken <= 64 << 10, "{taken} bytes of disk");
        let back = std::fs::read(&path).unwrap();
        assert!(back == data, "its bytes are kept");
        call.finish().unwrap();
        assert_eq!(kept.total_bytes(), taken);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_refusal_of_a_size_a_server_makes_up_does_not_overflow() {
        let root = scratch("huge");
        let kept = KeptOutputs::with_limits(&root, limits(1 << 20, 1 << 20, 1 << 20));
        let mut call = kept.begin("ws");
        keep(&mut call, "0-a", &[1u8; 4096]).unwrap();
        for quota in [Quota::Call, Quota::Workspace("ws".into()), Quota::Total] {
            let KeptOutputsError::OverQuota { would_take, .. } = call.over(quota, u64::MAX) else {
                panic!("not an over-quota refusal")
            };
            assert_eq!(would_take, u64::MAX);
        }
        drop(call);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn outputs_over_a_quota_are_refused_and_leave_nothing() {
        let root = scratch("quota");
        let dense = vec![7u8; 300 << 10];
        // Per call: two files of 300 KiB in a call of 512 KiB.
        let kept = KeptOutputs::with_limits(&root, limits(512 << 10, 4 << 20, 8 << 20));
        let mut call = kept.begin("ws");
        keep(&mut call, "0-a", &dense).unwrap();
        let err = keep(&mut call, "1-b", &dense).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidInput, "{err}");
        assert!(err.to_string().contains("per-call quota"), "{err}");
        drop(call);
        assert_eq!(kept.total_bytes(), 0, "nothing of the call is left");
        assert!(!kept.workspace_dir("ws").exists());
        // Per workspace: what earlier calls kept counts.
        let kept = KeptOutputs::with_limits(&root, limits(512 << 10, 700 << 10, 8 << 20));
        for _ in 0..2 {
            let mut call = kept.begin("ws");
            keep(&mut call, "0-a", &dense).unwrap();
            call.finish().unwrap();
        }
        let before = kept.total_bytes();
        let mut call = kept.begin("ws");
        let err = keep(&mut call, "0-a", &dense).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Conflict, "{err}");
        assert!(err.to_string().contains("workspace `ws`"), "{err}");
        drop(call);
        assert_eq!(kept.total_bytes(), before);
        // Another workspace has its own room, within the total.
        let kept = KeptOutputs::with_limits(&root, limits(512 << 10, 700 << 10, 800 << 10));
        let mut call = kept.begin("other");
        let err = keep(&mut call, "0-a", &dense).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Conflict, "{err}");
        assert!(err.to_string().contains("all kept outputs"), "{err}");
        drop(call);
        // Two calls at once, each within the room it measured: the one
        // that finishes past the quota keeps nothing.
        let kept = KeptOutputs::with_limits(&root, limits(1 << 20, 1 << 20, 8 << 20));
        let (mut one, mut two) = (kept.begin("third"), kept.begin("third"));
        keep(&mut one, "0-a", &dense).unwrap();
        keep(&mut one, "1-a", &dense).unwrap();
        keep(&mut two, "0-a", &dense).unwrap();
        keep(&mut two, "1-a", &dense).unwrap();
        one.finish().unwrap();
        let err = two.finish().unwrap_err();
        assert!(err.to_string().contains("workspace `third`"), "{err}");
        assert!(disk_usage(&kept.workspace_dir("third"), 2) <= 1 << 20);
        kept.remove_workspace("third").unwrap();
        // Removed with their workspace.
        kept.remove_workspace("ws").unwrap();
        assert_eq!(kept.total_bytes(), 0);
        kept.remove_workspace("ws").unwrap();
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn outputs_past_their_ttl_are_swept() {
        let root = scratch("ttl");
        let kept = KeptOutputs::with_limits(&root, OutputLimits::default());
        let mut call = kept.begin("ws");
        keep(&mut call, "0-a", &[1u8; 10_000]).unwrap();
        call.finish().unwrap();
        // As kept before: a file straight in a `<workspace>-<ms>` directory.
        let legacy = root.join(OUTPUTS_DIR).join("old-1");
        std::fs::create_dir_all(&legacy).unwrap();
        std::fs::write(legacy.join("0-x"), [1u8; 5000]).unwrap();
        assert_eq!(kept.sweep(), 0, "nothing is old yet");
        assert!(kept.total_bytes() > 0);
        let later = SystemTime::now() + Duration::from_secs(DEFAULT_TTL_SECS + 60);
        assert!(kept.sweep_at(later) >= 12_000);
        assert_eq!(kept.total_bytes(), 0);
        assert_eq!(
            crate::test_support::visible_entries(&root.join(OUTPUTS_DIR)),
            0
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn limits_come_from_config_json() {
        let root = scratch("config");
        assert_eq!(OutputLimits::load(&root).unwrap(), OutputLimits::default());
        std::fs::write(
            root.join(crate::host::settings::CONFIG_FILE),
            r#"{"outputs": {"max_call_bytes": 5, "ttl_secs": 60}}"#,
        )
        .unwrap();
        let l = OutputLimits::load(&root).unwrap();
        assert_eq!((l.max_call_bytes, l.ttl_secs), (5, 60));
        assert_eq!(l.max_workspace_bytes, DEFAULT_MAX_WORKSPACE_BYTES);
        std::fs::write(
            root.join(crate::host::settings::CONFIG_FILE),
            r#"{"outputs": {"max_calls": 5}}"#,
        )
        .unwrap();
        assert_eq!(
            OutputLimits::load(&root).unwrap_err().code(),
            ErrorCode::InvalidInput
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
