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
/// How many quiet periods a call may last while its browser keeps
/// answering.
const STRETCH: u32 = 10;
/// The longest any call lasts, whatever its browser does.
const CALL_CEILING: Duration = Duration::from_secs(900);

/// The longest a call whose browser may stay silent for `quiet` lasts.
pub fn stretched(quiet: Duration) -> Duration {
    (quiet * STRETCH).min(CALL_CEILING)
}

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
    /// and returns its result. The deadline follows progress, not the
    /// clock alone: `quiet` is how long the browser may stay silent. Each
    /// message it sends (an event) gives the call `quiet` again; when it
    /// has been silent that long, the browser is asked whether it still
    /// answers (`Browser.getVersion`), and an answer within `quiet` gives
    /// the call `quiet` again. A slow host (guest kernel code emulated)
    /// thus gets the time its browser is visibly using, never more than
    /// [`stretched`]`(quiet)` in all; a browser that stops answering
    /// fails the call after at most twice `quiet`.
    pub async fn call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
        quiet: Duration,
    ) -> Result<Value, BrowserError> {
        let id = self.send(session, method, params).await?;
        let started = Instant::now();
        let ceiling = started + stretched(quiet);
        let mut deadline = started + quiet;
        let mut ping: Option<u64> = None;
        loop {
            let Some(value) = self.read_until(deadline).await? else {
                if ping.is_some() || Instant::now() >= ceiling {
                    return Err(BrowserError::Timeout {
                        what: method.to_owned(),
                        secs: started.elapsed().as_secs(),
                    });
                }
                ping = Some(self.send(None, "Browser.getVersion", json!({})).await?);
                deadline = (Instant::now() + quiet).min(ceiling);
                continue;
            };
            match value.get("id").and_then(Value::as_u64) {
                Some(answered) if answered == id => {
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
                // The browser still answers: the call waits on.
                Some(answered) if Some(answered) == ping => ping = None,
                // An answer to an earlier call's question.
                Some(_) => continue,
                None => self.keep_event(value),
            }
            deadline = (Instant::now() + quiet).min(ceiling);
        }
    }

    /// Sends `method` with a new id, which it returns.
    async fn send(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<u64, BrowserError> {
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
        Ok(id)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::DuplexStream;

    const QUIET: Duration = Duration::from_millis(200);

    /// A browser at the other end of a pipe that answers each command
    /// after `delay(method)`, or never (None); answers and commands
    /// interleave as a real browser's do.
    async fn browser(delay: fn(&str) -> Option<Duration>) -> Cdp<DuplexStream> {
        let (client, server) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let ws = tokio_tungstenite::accept_async(server).await.unwrap();
            let (mut sink, mut stream) = ws.split();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
            tokio::spawn(async move {
                while let Some(text) = rx.recv().await {
                    if sink.send(Message::text(text)).await.is_err() {
                        return;
                    }
                }
            });
            while let Some(Ok(Message::Text(text))) = stream.next().await {
                let cmd: Value = serde_json::from_str(&text).unwrap();
                let method = cmd["method"].as_str().unwrap_or_default().to_owned();
                let Some(after) = delay(&method) else {
                    continue;
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ =
                        tx.send(json!({"id": cmd["id"], "result": {"method": method}}).to_string());
                });
            }
        });
        Cdp::handshake(client, 9222, "/devtools/browser/test")
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_slow_call_waits_while_its_browser_still_answers() {
        let mut cdp = browser(|m| match m {
            "Page.enable" => Some(QUIET * 3),
            _ => Some(Duration::ZERO),
        })
        .await;
        let got = cdp
            .call(None, "Page.enable", json!({}), QUIET)
            .await
            .unwrap();
        assert_eq!(got["method"], "Page.enable");
        // The connection is still in step: the next call gets its own answer.
        let next = cdp
            .call(None, "DOM.enable", json!({}), QUIET)
            .await
            .unwrap();
        assert_eq!(next["method"], "DOM.enable");
    }

    #[tokio::test]
    async fn a_browser_that_stops_answering_fails_the_call_soon() {
        let mut cdp = browser(|_| None).await;
        let began = Instant::now();
        let err = cdp
            .call(None, "Page.enable", json!({}), QUIET)
            .await
            .unwrap_err();
        assert!(matches!(err, BrowserError::Timeout { .. }), "{err}");
        assert!(
            began.elapsed() >= QUIET * 2,
            "asked whether it answers first"
        );
        assert!(
            began.elapsed() < stretched(QUIET),
            "not held to the ceiling"
        );
    }

    #[tokio::test]
    async fn a_call_that_never_ends_stops_at_its_ceiling() {
        let mut cdp = browser(|m| (m == "Browser.getVersion").then_some(Duration::ZERO)).await;
        let began = Instant::now();
        let err = cdp
            .call(None, "Page.enable", json!({}), QUIET)
            .await
            .unwrap_err();
        assert!(matches!(err, BrowserError::Timeout { .. }), "{err}");
        assert!(began.elapsed() >= stretched(QUIET));
        assert!(stretched(Duration::from_secs(3600)) == CALL_CEILING);
    }
}
