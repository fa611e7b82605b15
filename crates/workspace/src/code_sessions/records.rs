//! The host's records of a workspace's code sessions, in its directory
//! (`code/`, 0700): one `<id>.json` (0600: it holds the kernel's key)
//! per session, a lock for starting and ending them, and one per session
//! that its runs take in turn (across processes).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use base::store::file_lock::FileLock;

use super::{CodeLanguage, CodeSessionError};

/// Largest record read.
const MAX_RECORD_BYTES: u64 = 64 * 1024;
/// Highest session number (ids are `code-` and at most 6 digits).
const MAX_NUMBER: u32 = 999_999;

/// How the host reaches a session's kernel, and what it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRecord {
    pub id: String,
    pub language: CodeLanguage,
    /// The id of the kernel's background process when it is not the
    /// session's: a kernel made ahead (`ready`) that the session took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    /// The kernel's background process's pid.
    pub pid: u32,
    /// That process's start (the guest's clock): a process of the same
    /// id started since is another kernel.
    pub started_unix_ms: u64,
    pub created_unix_ms: u64,
    /// The connection file's `key` (HMAC-SHA256).
    pub key: String,
    pub shell_port: u16,
    pub iopub_port: u16,
    pub control_port: u16,
}

impl SessionRecord {
    /// The id of the kernel's background process.
    pub fn process(&self) -> &str {
        self.process.as_deref().unwrap_or(&self.id)
    }
}

/// A workspace's `code/` directory.
#[derive(Clone, Debug)]
pub(crate) struct CodeDir {
    dir: PathBuf,
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> CodeSessionError {
    move |source| CodeSessionError::Io { what, source }
}

impl CodeDir {
    pub fn new(ws_dir: &Path) -> Self {
        Self {
            dir: ws_dir.join("code"),
        }
    }

    async fn lock_at(&self, name: &str) -> Result<FileLock, CodeSessionError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io(format!("creating {}", self.dir.display())))?;
        let path = self.dir.join(name);
        loop {
            match FileLock::try_exclusive(&path) {
                Ok(Some(lock)) => return Ok(lock),
                Ok(None) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => return Err(io(format!("locking {}", path.display()))(e)),
            }
        }
    }

    /// The lock that starting and ending sessions take.
    pub async fn lock(&self) -> Result<FileLock, CodeSessionError> {
        self.lock_at("lock").await
    }

    /// The lock a run of session `id` holds.
    pub async fn run_lock(&self, id: &str) -> Result<FileLock, CodeSessionError> {
        self.lock_at(&format!("{id}.lock")).await
    }

    /// Every record (unreadable ones left out), by id.
    pub fn list(&self) -> Vec<SessionRecord> {
        let mut records: Vec<SessionRecord> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let id = name.strip_suffix(".json")?;
                self.load(id)
            })
            .collect();
        records.sort_by_key(|r| number(&r.id));
        records
    }

    /// Session `id`'s record, if there is one.
    pub fn load(&self, id: &str) -> Option<SessionRecord> {
        if !is_session_id(id) {
            return None;
        }
        // Our own file, but read within a bound all the same.
        let file = std::fs::File::open(self.dir.join(format!("{id}.json"))).ok()?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_RECORD_BYTES), &mut bytes)
            .ok()?;
        serde_json::from_slice::<SessionRecord>(&bytes)
            .ok()
            .filter(|r| r.id == id)
    }

    /// Takes the next id (`code-N`): numbers only go up, so an id once
    /// handed out never names another kernel (`next` keeps the count;
    /// the caller holds [`CodeDir::lock`]).
    pub fn take_id(&self) -> Result<String, CodeSessionError> {
        let path = self.dir.join("next");
        let counted = std::fs::read_to_string(&path)
            .ok()
            .and_then(|n| n.trim().parse::<u32>().ok())
            .unwrap_or(1);
        let above = self
            .list()
            .iter()
            .filter_map(|r| number(&r.id))
            .max()
            .map_or(1, |n| n + 1);
        let next = counted.max(above).max(1);
        if next > MAX_NUMBER {
            return Err(CodeSessionError::Io {
                what: "numbering a session".into(),
                source: std::io::Error::other("every session number was used"),
            });
        }
        std::fs::write(&path, format!("{}\n", next + 1))
            .map_err(io(format!("writing {}", path.display())))?;
        Ok(format!("code-{next}"))
    }

    /// Saves `record` (0600, atomically).
    pub fn save(&self, record: &SessionRecord) -> Result<(), CodeSessionError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(format!("{}.json", record.id));
        let tmp = self.dir.join(format!("{}.json.tmp", record.id));
        let bytes = serde_json::to_vec(record).unwrap_or_default();
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&bytes))
            .and_then(|()| std::fs::rename(&tmp, &path));
        written.map_err(io(format!("writing {}", path.display())))
    }

    /// Forgets session `id`.
    pub fn remove(&self, id: &str) -> Result<(), CodeSessionError> {
        for name in [format!("{id}.json"), format!("{id}.lock")] {
            match std::fs::remove_file(self.dir.join(&name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(format!("removing {name}"))(e)),
            }
        }
        Ok(())
    }
}

/// `code-N` with N a number: the only ids taken (they name files).
pub fn is_session_id(id: &str) -> bool {
    number(id).is_some()
}

fn number(id: &str) -> Option<u32> {
    let n = id.strip_prefix("code-")?;
    (!n.is_empty() && n.len() <= 6 && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| n.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> SessionRecord {
        SessionRecord {
            id: id.into(),
            language: CodeLanguage::Python,
            process: None,
            pid: 7,
            started_unix_ms: 1,
            created_unix_ms: 2,
            key: "k".into(),
            shell_port: 1,
            iopub_port: 2,
            control_port: 3,
        }
    }

    #[test]
    fn records_are_kept_private_numbered_on_and_forgotten() {
        use std::os::unix::fs::PermissionsExt;
        let ws = std::env::temp_dir().join(format!("microagent-code-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&ws);
        std::fs::create_dir_all(&ws).unwrap();
        let dir = CodeDir::new(&ws);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _lock = rt.block_on(dir.lock()).unwrap();
        assert_eq!(dir.take_id().unwrap(), "code-1");
        dir.save(&record("code-1")).unwrap();
        dir.save(&record("code-9")).unwrap();
        assert_eq!(dir.take_id().unwrap(), "code-10");
        let mode = std::fs::metadata(ws.join("code/code-1.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(ws.join("code"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        assert_eq!(dir.load("code-1"), Some(record("code-1")));
        // A session on a kernel made ahead names its process; a record
        // written before there were any reads as its own process.
        let taken = SessionRecord {
            process: Some("code-ready-python".into()),
            ..record("code-2")
        };
        dir.save(&taken).unwrap();
        assert_eq!(dir.load("code-2").unwrap().process(), "code-ready-python");
        assert_eq!(record("code-1").process(), "code-1");
        let old = serde_json::to_value(record("code-1")).unwrap();
        assert!(old.get("process").is_none(), "{old}");
        dir.remove("code-2").unwrap();
        // Ids that are not ours name no file.
        for bad in [
            "../code-1",
            "code-",
            "code-x",
            "code-1/..",
            "lock",
            "code-1234567",
        ] {
            assert_eq!(dir.load(bad), None, "{bad}");
        }
        // A record under another id's name is not that id's.
        std::fs::write(
            ws.join("code/code-3.json"),
            serde_json::to_vec(&record("code-1")).unwrap(),
        )
        .unwrap();
        assert_eq!(dir.load("code-3"), None);
        std::fs::write(ws.join("code/code-4.json"), b"{garbage").unwrap();
        let ids: Vec<String> = dir.list().into_iter().map(|r| r.id).collect();
        assert_eq!(ids, ["code-1", "code-9"]);
        dir.remove("code-9").unwrap();
        dir.remove("code-9").unwrap();
        // A stopped session's id is not handed out again.
        assert_eq!(dir.take_id().unwrap(), "code-11");
        // An oversized record reads as none.
        std::fs::write(ws.join("code/code-5.json"), vec![b' '; 100 * 1024]).unwrap();
        assert_eq!(dir.load("code-5"), None);
        let _ = std::fs::remove_dir_all(&ws);
    }
}
