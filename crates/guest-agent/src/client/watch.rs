//! The file-watch operations of [`GuestAgentClient`]: like background
//! processes, a watch started by one client is read and stopped by any
//! other.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use super::messages::expect_ok;
use super::{ClientError, GuestAgentClient};
use crate::protocol::{Request, Response, WatchBatch, WatchEntry};

impl<S: AsyncRead + AsyncWrite + Unpin + Send> GuestAgentClient<S> {
    /// Starts following changes under `path` (with `recursive`, in every
    /// directory below it too).
    pub async fn watch_start(self, path: &str, recursive: bool) -> Result<WatchEntry, ClientError> {
        let req = Request::WatchStart {
            path: path.to_owned(),
            recursive,
        };
        match self.call(&req).await? {
            Response::Watch(entry) => Ok(entry),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// Watch `id`'s events from `since`, waiting up to `wait` for one
    /// when there is none yet.
    pub async fn watch_events(
        mut self,
        id: &str,
        since: u64,
        wait: Duration,
    ) -> Result<WatchBatch, ClientError> {
        let req = Request::WatchEvents {
            id: id.to_owned(),
            since,
            wait_ms: Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
        };
        // The long-poll may hold the answer back for `wait`.
        self.idle = self.idle.saturating_add(wait);
        match self.call(&req).await? {
            Response::WatchEvents(batch) => Ok(batch),
            other => Err(ClientError::unexpected(&other)),
        }
    }

    /// Ends watch `id`.
    pub async fn watch_stop(self, id: &str) -> Result<(), ClientError> {
        let req = Request::WatchStop { id: id.to_owned() };
        expect_ok(self.call(&req).await?).map(drop)
    }

    /// Every watch, oldest first.
    pub async fn watch_list(self) -> Result<Vec<WatchEntry>, ClientError> {
        match self.call(&Request::WatchList).await? {
            Response::Watches { watches } => Ok(watches),
            other => Err(ClientError::unexpected(&other)),
        }
    }
}
