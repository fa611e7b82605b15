//! What outlives one browser call, in `<workspace dir>/browser/`: the
//! pages (name -> DevTools target) and their refs (`state.json`), the log
//! (`events.jsonl`), and the lock one call holds at a time (`lock`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{BrowserError, BrowserEventKind};
use base::store::events::EventLog;
use base::store::file_lock::FileLock;

/// One named page.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PageState {
    /// Its DevTools target.
    pub target_id: String,
    /// The refs of its last snapshot: `e1` -> backend DOM node id.
    #[serde(default)]
    pub refs: BTreeMap<String, i64>,
    /// The newest console message logged (its timestamp, the guest's ms).
    #[serde(default)]
    pub console_ms: f64,
}

/// The browser's pages, as of the browser process that made them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BrowserState {
    /// When the browser process started (the guest's clock): pages of
    /// another browser process are gone.
    #[serde(default)]
    pub browser_started_ms: u64,
    /// Pages by name.
    #[serde(default)]
    pub pages: BTreeMap<String, PageState>,
}

/// The browser directory of one workspace.
#[derive(Clone, Debug)]
pub struct BrowserDir {
    dir: PathBuf,
}

impl BrowserDir {
    /// The browser directory of the workspace directory `ws`.
    pub fn new(ws: &Path) -> Self {
        Self {
            dir: ws.join("browser"),
        }
    }

    fn io(what: String) -> impl FnOnce(std::io::Error) -> BrowserError {
        move |source| BrowserError::Io { what, source }
    }

    /// Waits for the lock that makes calls on one workspace's browser take
    /// turns (across processes).
    pub async fn lock(&self) -> Result<FileLock, BrowserError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(Self::io(format!("creating {}", self.dir.display())))?;
        let path = self.dir.join("lock");
        loop {
            match FileLock::try_exclusive(&path) {
                Ok(Some(lock)) => return Ok(lock),
                Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => return Err(Self::io(format!("locking {}", path.display()))(e)),
            }
        }
    }

    /// The saved state (empty when there is none or it is unreadable: the
    /// pages are then found again by name).
    pub fn load(&self) -> BrowserState {
        std::fs::read(self.dir.join("state.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Saves `state` (atomically).
    pub fn save(&self, state: &BrowserState) -> Result<(), BrowserError> {
        let path = self.dir.join("state.json");
        let tmp = self.dir.join("state.json.tmp");
        let bytes = serde_json::to_vec_pretty(state).unwrap_or_default();
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(Self::io(format!("writing {}", path.display())))
    }

    /// The browser log.
    pub fn events(&self) -> EventLog<BrowserEventKind> {
        EventLog::at(self.dir.join("events.jsonl"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_and_events_round_trip_and_a_bad_file_reads_as_empty() {
        let ws = std::env::temp_dir().join(format!("microagent-browser-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&ws);
        std::fs::create_dir_all(&ws).unwrap();
        let dir = BrowserDir::new(&ws);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let lock = rt.block_on(dir.lock()).unwrap();
        assert_eq!(dir.load(), BrowserState::default());
        let mut state = BrowserState {
            browser_started_ms: 5,
            ..BrowserState::default()
        };
        state.pages.insert(
            "default".into(),
            PageState {
                target_id: "T1".into(),
                refs: BTreeMap::from([("e1".into(), 42)]),
                console_ms: 1.5,
            },
        );
        dir.save(&state).unwrap();
        assert_eq!(dir.load(), state);
        std::fs::write(ws.join("browser/state.json"), "{not json").unwrap();
        assert_eq!(dir.load(), BrowserState::default());
        let log = dir.events();
        log.append(BrowserEventKind::Action {
            page: "default".into(),
            action: "open about:blank".into(),
        })
        .unwrap();
        let e = log
            .append(BrowserEventKind::Console {
                page: "default".into(),
                level: "log".into(),
                text: "hi".into(),
            })
            .unwrap();
        assert_eq!(e.seq, 2);
        assert_eq!(log.read_after(1).unwrap()[0].kind, e.kind);
        drop(lock);
        let _ = std::fs::remove_dir_all(&ws);
    }
}
