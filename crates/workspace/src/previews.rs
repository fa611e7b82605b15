//! Preview URLs as calls (issue 61; the records are
//! `base::store::previews`'): a workspace's (`dev.previews()`:
//! [`WorkspacePreviews`] `create`, `revoke`, `list`) and the collection's,
//! which a preview server makes with the token a request carries
//! (`preview_target`, `open_preview`).

use std::time::Duration;

use base::host::settings::now_ms;

use crate::error::{Error, Result};
use crate::workspaces::handle::Workspace;
use crate::workspaces::manager::Workspaces;
use base::store::previews::PreviewStore;
pub use base::store::previews::{
    IssuedPreview, PreviewError, PreviewRecord, DEFAULT_PREVIEW_TTL, MAX_PREVIEW_TTL, PREVIEW_PATH,
};

/// What a live preview reaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreviewTarget {
    /// The workspace's full name.
    pub workspace: String,
    /// The guest port.
    pub port: u16,
    /// When that workspace was made (one made again is another).
    pub workspace_created_at_ms: u64,
}

/// A workspace's preview URLs (`dev.previews()`).
#[derive(Clone, Copy, Debug)]
pub struct WorkspacePreviews<'a> {
    ws: Workspace<'a>,
}

impl<'a> Workspace<'a> {
    /// This workspace's preview URLs.
    pub fn previews(self) -> WorkspacePreviews<'a> {
        WorkspacePreviews { ws: self }
    }
}

impl WorkspacePreviews<'_> {
    /// Makes a preview of its guest port `port`, lasting `ttl` (default
    /// [`DEFAULT_PREVIEW_TTL`], at most [`MAX_PREVIEW_TTL`]): the token is
    /// in the answer and nowhere else. The workspace need not run: the
    /// first request wakes it as any call does.
    pub fn create(self, port: u16, ttl: Option<Duration>) -> Result<IssuedPreview> {
        let ws = self.ws;
        if ws.remote()?.is_some() {
            return Err(Error::InvalidInput(format!(
                "workspace `{}` runs on a server: its previews are that server's to serve",
                ws.name()
            )));
        }
        let ttl = ttl.unwrap_or(DEFAULT_PREVIEW_TTL);
        if ttl.is_zero() || ttl > MAX_PREVIEW_TTL {
            return Err(PreviewError::Lifetime {
                asked: ttl.as_secs(),
            }
            .into());
        }
        let (all, name) = (ws.all, ws.name().to_owned());
        let meta = ws.get_here()?;
        let now = now_ms();
        let record = PreviewRecord {
            workspace: name,
            workspace_created_at_ms: meta.created_at_ms,
            port,
            created_at_ms: now,
            expires_at_ms: now.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
            agent: all.caller.as_ref().and_then(|c| c.agent()),
        };
        Ok(PreviewStore::new(&all.state).create(record, now)?)
    }

    /// Revokes its previews of `port` (every one of its previews when
    /// `None`); how many went.
    pub fn revoke(self, port: Option<u16>) -> Result<usize> {
        let name = self.ws.name().to_owned();
        self.ws.get_here()?;
        Ok(PreviewStore::new(&self.ws.all.state)
            .remove_where(|r| r.workspace == name && port.is_none_or(|p| r.port == p))?)
    }

    /// Its live previews (their tokens are not kept).
    pub fn list(self) -> Result<Vec<PreviewRecord>> {
        let name = self.ws.name().to_owned();
        self.ws.get_here()?;
        Ok(PreviewStore::new(&self.ws.all.state).list_where(now_ms(), |r| r.workspace == name)?)
    }
}

impl Workspaces {
    /// What `token` opens now: `None` for anything but the token of a
    /// live preview of a workspace that is still the one it was made for
    /// (the previews of a workspace deleted, or made again under its
    /// name, go when found).
    pub fn preview_target(&self, token: &str) -> Result<Option<PreviewTarget>> {
        let store = PreviewStore::new(&self.state);
        let Some(record) = store.find(token, now_ms())? else {
            return Ok(None);
        };
        // Gone or made again: its previews go (those of the one there now
        // stay). Any other failure to read it says nothing of them.
        let meta = match self
            .dir(&record.workspace)
            .and_then(|dir| Ok(dir.read_meta()?))
        {
            Ok(meta) => Some(meta),
            Err(e) if e.code() == base::code::ErrorCode::NotFound => None,
            Err(e) => return Err(e),
        };
        let now_made = meta.as_ref().map(|m| m.created_at_ms);
        if now_made != Some(record.workspace_created_at_ms) {
            let workspace = record.workspace.clone();
            store.remove_where(|r| {
                r.workspace == workspace && Some(r.workspace_created_at_ms) != now_made
            })?;
            return Ok(None);
        }
        // Made by an agent that may no longer use it (a share taken back).
        if let (Some(agent), Some(meta)) = (&record.agent, &meta) {
            let mine = meta.spec.agent.as_deref() == Some(agent.as_str());
            if !mine && !meta.spec.shared_with.contains(agent) {
                return Ok(None);
            }
        }
        Ok(Some(PreviewTarget {
            workspace: record.workspace,
            port: record.port,
            workspace_created_at_ms: record.workspace_created_at_ms,
        }))
    }

    /// A connection to the guest port `target` names, through its agent;
    /// a paused or hibernated workspace is woken first, as any call wakes
    /// it (and still the one the preview was made for once awake).
    pub async fn open_preview(&self, target: &PreviewTarget) -> Result<tokio::net::UnixStream> {
        let name = target.workspace.as_str();
        let (dir, meta) = self.awake(name).await?;
        if meta.created_at_ms != target.workspace_created_at_ms {
            return Err(Error::WorkspaceNotFound(name.to_owned()));
        }
        crate::guest::connect_awake(self, name, &dir)
            .await?
            .tcp_connect(target.port)
            .await
            .map_err(Error::agent("tcp_connect"))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::workspaces::manager::tests::{fixture, have_mkfs, session, spec};
    use base::code::ErrorCode;
    use base::store::previews::{PreviewStore, PREVIEWS_DIR};
    use base::store::spec::DeleteOptions;

    #[test]
    fn a_preview_is_kept_by_its_tokens_digest_and_opens_only_its_port() {
        if !have_mkfs("a_preview_is_kept_by_its_tokens_digest_and_opens_only_its_port") {
            return;
        }
        let f = fixture("previews", "/nonexistent");
        f.ws.create("dev", spec()).unwrap();
        let dev = f.ws.workspace("dev").unwrap();
        let made = dev.previews().create(8080, None).unwrap();
        assert_eq!(made.token.len(), 64);
        assert!(made.token.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(made.path, format!("/preview/{}/", made.token));
        assert_eq!(
            (made.record.port, made.record.workspace.as_str()),
            (8080, "dev")
        );
        let ttl = made.record.expires_at_ms - made.record.created_at_ms;
        assert_eq!(ttl, DEFAULT_PREVIEW_TTL.as_millis() as u64);
        // Only the digest is kept: the directory gives no token away.
        let dir = f.ws.state_dir().root().join(PREVIEWS_DIR);
        let files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(files.len(), 1);
        let kept = std::fs::read_to_string(files[0].path()).unwrap();
        assert!(!kept.contains(&made.token));

        let target = f.ws.preview_target(&made.token).unwrap().unwrap();
        assert_eq!(
            target,
            PreviewTarget {
                workspace: "dev".into(),
                port: 8080,
                workspace_created_at_ms: made.record.workspace_created_at_ms,
            }
        );
        // Upper case is the same token; anything else opens nothing.
        assert!(f
            .ws
            .preview_target(&made.token.to_uppercase())
            .unwrap()
            .is_some());
        let other = "0".repeat(64);
        for wrong in [
            other.as_str(),
            "",
            "../../etc/passwd",
            &made.token[..63],
            "g".repeat(64).as_str(),
        ] {
            assert_eq!(f.ws.preview_target(wrong).unwrap(), None, "{wrong}");
        }
        assert_eq!(dev.previews().list().unwrap(), vec![made.record.clone()]);
        // Revoked: gone, and only that port's.
        let second = dev
            .previews()
            .create(9000, Some(Duration::from_secs(60)))
            .unwrap();
        assert_eq!(dev.previews().revoke(Some(8080)).unwrap(), 1);
        assert_eq!(f.ws.preview_target(&made.token).unwrap(), None);
        assert!(f.ws.preview_target(&second.token).unwrap().is_some());
        assert_eq!(dev.previews().revoke(None).unwrap(), 1);
        assert_eq!(f.ws.preview_target(&second.token).unwrap(), None);
    }

    #[test]
    fn previews_end_with_their_workspace_and_bad_requests_change_nothing() {
        if !have_mkfs("previews_end_with_their_workspace_and_bad_requests_change_nothing") {
            return;
        }
        let f = fixture("previews-end", "/nonexistent");
        // Made by agent alpha's session.
        session(&f.ws, Some("alpha")).create("dev", spec()).unwrap();
        let dev = f.ws.workspace("dev").unwrap();
        let dir = f.ws.state_dir().root().join(PREVIEWS_DIR);
        let count = || std::fs::read_dir(&dir).map_or(0, |d| d.count());
        for (port, ttl) in [
            (0, None),
            (80, Some(Duration::ZERO)),
            (80, Some(MAX_PREVIEW_TTL + Duration::from_secs(1))),
        ] {
            let refused = dev.previews().create(port, ttl).unwrap_err();
            assert_eq!(refused.code(), ErrorCode::InvalidInput, "{refused}");
        }
        assert_eq!(count(), 0);
        // Another agent's session may not make one of it.
        let beta = session(&f.ws, Some("beta"));
        assert_eq!(
            beta.workspace("dev")
                .and_then(|w| w.previews().create(80, None))
                .unwrap_err()
                .code(),
            ErrorCode::Forbidden
        );
        // One made by an agent it is shared with works while the share
        // does.
        let alpha = session(&f.ws, Some("alpha"));
        alpha
            .workspace("dev")
            .unwrap()
            .share_with("beta", true)
            .unwrap();
        let by_beta = beta
            .workspace("dev")
            .unwrap()
            .previews()
            .create(80, None)
            .unwrap();
        assert!(f.ws.preview_target(&by_beta.token).unwrap().is_some());
        alpha
            .workspace("dev")
            .unwrap()
            .share_with("beta", false)
            .unwrap();
        assert_eq!(f.ws.preview_target(&by_beta.token).unwrap(), None);
        // Made again under its name, a workspace is not reached by the old
        // token; deleted, its previews go.
        let old = dev.previews().create(80, None).unwrap();
        f.ws.at("dev").delete(DeleteOptions::default()).unwrap();
        assert_eq!(count(), 0, "deleted with it");
        f.ws.create("dev", spec()).unwrap();
        assert_eq!(f.ws.preview_target(&old.token).unwrap(), None);
        let kept =
            f.ws.workspace("dev")
                .unwrap()
                .previews()
                .create(80, None)
                .unwrap();
        let store = PreviewStore::new(f.ws.state_dir());
        // Recorded for a workspace made at another time: refused and swept.
        let stale = store
            .create(
                PreviewRecord {
                    workspace_created_at_ms: 1,
                    ..kept.record.clone()
                },
                kept.record.created_at_ms,
            )
            .unwrap();
        assert_eq!(f.ws.preview_target(&stale.token).unwrap(), None);
        assert_eq!(
            store
                .list_where(kept.record.created_at_ms, |_| true)
                .unwrap(),
            vec![kept.record.clone()],
            "the stale one went"
        );
        assert!(
            f.ws.preview_target(&kept.token).unwrap().is_some(),
            "the one of the workspace there now stays"
        );
    }
}
