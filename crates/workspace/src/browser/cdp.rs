//! A minimal Chrome DevTools Protocol client: JSON commands and events over
//! one websocket (tokio-tungstenite), on any stream (here the agent's
//! `tcp_connect` tunnel into the guest). One caller drives it in turn:
//! `call` reads until its answer and keeps the events it passes, which
//! `next_event` then hands out.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::BrowserError;

/// Largest message taken from the browser (a full-page screenshot of a
/// large viewport, base64).
const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// An event the browser sent.
#[derive(Clone, Debug)]
pub struct CdpEvent {
    /// `Page.loadEventFired`, `Runtime.consoleAPICalled`, ...
    pub method: String,
    /// Its parameters.
    pub params: Value,
    /// The attached target's session, if it came from one.
    pub session: Option<String>,
}

/// One DevTools connection.
pub struct Cdp<S> {
    ws: WebSocketStream<S>,
    next_id: u64,
    events: VecDeque<CdpEvent>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Cdp<S> {
    /// Opens the websocket at `path` (`/devtools/browser/<id>`) over
    /// `stream`, which reaches 127.0.0.1:`port`.
    pub async fn handshake(stream: S, port: u16, path: &str) -> Result<Self, BrowserError> {
        let url = format!("ws://127.0.0.1:{port}{path}");
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        let (ws, _) = tokio_tungstenite::client_async_with_config(url, stream, Some(config))
            .await
            .map_err(|e| BrowserError::Websocket(Box::new(e)))?;
        Ok(Self {
            ws,
            next_id: 1,
            events: VecDeque::new(),
        })
    }

    /// Sends `method` (to the attached target `session`, or the browser)
    /// and returns its result, within `within`.
    pub async fn call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
        within: Duration,
    ) -> Result<Value, BrowserError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .await
            .map_err(|e| BrowserError::Websocket(Box::new(e)))?;
        let deadline = Instant::now() + within;
        loop {
            let Some(value) = self.read_until(deadline).await? else {
                return Err(BrowserError::Timeout {
                    what: method.to_owned(),
                    secs: within.as_secs(),
                });
            };
            if value.get("id").and_then(Value::as_u64) == Some(id) {
                if let Some(err) = value.get("error") {
                    return Err(BrowserError::Protocol {
                        method: method.to_owned(),
                        message: err
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("no message")
                            .to_owned(),
                    });
                }
                return Ok(value.get("result").cloned().unwrap_or(Value::Null));
            }
            self.keep_event(value);
        }
    }

    /// The next event, kept or arriving before `deadline`.
    pub async fn next_event(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<CdpEvent>, BrowserError> {
        loop {
            if let Some(e) = self.events.pop_front() {
                return Ok(Some(e));
            }
            match self.read_until(deadline).await? {
                Some(value) => self.keep_event(value),
                None => return Ok(None),
            }
        }
    }

    fn keep_event(&mut self, value: Value) {
        let Some(method) = value.get("method").and_then(Value::as_str) else {
            return;
        };
        self.events.push_back(CdpEvent {
            method: method.to_owned(),
            params: value.get("params").cloned().unwrap_or(Value::Null),
            session: value
                .get("sessionId")
                .and_then(Value::as_str)
                .map(str::to_owned),
        });
    }

    /// The next JSON message, or None at `deadline`.
    async fn read_until(&mut self, deadline: Instant) -> Result<Option<Value>, BrowserError> {
        loop {
            let next = match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return Ok(None),
                Ok(None) => return Err(BrowserError::Closed),
                Ok(Some(m)) => m.map_err(|e| BrowserError::Websocket(Box::new(e)))?,
            };
            let text = match next {
                Message::Text(t) => t.to_string(),
                Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
                Message::Close(_) => return Err(BrowserError::Closed),
                _ => continue,
            };
            // A message that is not JSON is not ours to act on.
            if let Ok(value) = serde_json::from_str::<Value>(&text) {
                return Ok(Some(value));
            }
        }
    }

    /// Closes the websocket (the browser keeps running).
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}
