//! A minimal Chrome DevTools Protocol client: JSON commands and events over
//! one websocket (tokio-tungstenite), on any stream (here the agent's
//! `tcp_connect` tunnel into the guest). One caller drives it in turn:
//! `call` reads until its answer and keeps the events it passes, which
//! `next_event` then hands out. Everything the browser sends is the
//! guest's: a message is read for its id, method and session only; an
//! event's parameters stay text, bounded, until handed out.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
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
/// Bytes of events kept while a call waits for its answer, and how many:
/// past either the oldest go (they are what the page did, logged as far as
/// they are kept), so a browser that floods events cannot grow the host's
/// memory.
const KEPT_EVENT_BYTES: usize = 16 << 20;
const KEPT_EVENTS: usize = 10_000;

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

/// What this client reads of every message; the rest is skipped unread.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    id: Option<u64>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default, rename = "sessionId")]
    session: Option<String>,
}

/// An answer's outcome.
#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

/// An event's parameters, read when it is handed out.
#[derive(Deserialize)]
struct Params {
    #[serde(default)]
    params: Value,
}

/// An event kept as its text.
struct Kept {
    method: String,
    session: Option<String>,
    text: String,
}

/// One DevTools connection.
pub struct Cdp<S> {
    ws: WebSocketStream<S>,
    next_id: u64,
    /// Events read and not handed out yet.
    events: VecDeque<Kept>,
    /// The bytes of `events` together.
    kept_bytes: usize,
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
            kept_bytes: 0,
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
        let ceiling = Instant::now() + stretched(quiet);
        self.call_until(session, method, params, quiet, ceiling)
            .await
    }

    /// Sends `method` and returns its result by `deadline` at the latest,
    /// whatever the browser does meanwhile (a call bound to its caller's
    /// time, such as a navigation within the timeout it was given).
    pub async fn call_by(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
        deadline: Instant,
    ) -> Result<Value, BrowserError> {
        let quiet = deadline.saturating_duration_since(Instant::now());
        self.call_until(session, method, params, quiet, deadline)
            .await
    }

    async fn call_until(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
        quiet: Duration,
        ceiling: Instant,
    ) -> Result<Value, BrowserError> {
        let id = self.send(session, method, params).await?;
        let started = Instant::now();
        let mut deadline = (started + quiet).min(ceiling);
        let mut ping: Option<u64> = None;
        loop {
            let Some((text, head)) = self.read_until(deadline).await? else {
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
            match head.id {
                Some(answered) if answered == id => return answer_of(method, &text),
                // The browser still answers: the call waits on.
                Some(answered) if Some(answered) == ping => ping = None,
                // An answer to an earlier call's question.
                Some(_) => continue,
                None => self.keep_event(head, text),
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
            if let Some(kept) = self.events.pop_front() {
                self.kept_bytes -= kept.text.len();
                let params = serde_json::from_str::<Params>(&kept.text)
                    .map(|p| p.params)
                    .unwrap_or(Value::Null);
                return Ok(Some(CdpEvent {
                    method: kept.method,
                    params,
                    session: kept.session,
                }));
            }
            match self.read_until(deadline).await? {
                Some((text, head)) if head.id.is_none() => self.keep_event(head, text),
                // An answer nobody waits for any more.
                Some(_) => continue,
                None => return Ok(None),
            }
        }
    }

    fn keep_event(&mut self, head: Head, text: String) {
        let Some(method) = head.method else {
            return;
        };
        self.kept_bytes += text.len();
        self.events.push_back(Kept {
            method,
            session: head.session,
            text,
        });
        while self.kept_bytes > KEPT_EVENT_BYTES || self.events.len() > KEPT_EVENTS {
            let Some(oldest) = self.events.pop_front() else {
                break;
            };
            self.kept_bytes -= oldest.text.len();
        }
    }

    /// The next message, its text and what it says of itself, or None at
    /// `deadline`. A message that is not JSON is not ours to act on.
    async fn read_until(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<(String, Head)>, BrowserError> {
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
            if let Ok(head) = serde_json::from_str::<Head>(&text) {
                return Ok(Some((text, head)));
            }
        }
    }

    /// Closes the websocket (the browser keeps running).
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// The result of `method` from its answer's text, or the browser's error.
fn answer_of(method: &str, text: &str) -> Result<Value, BrowserError> {
    let answer: Answer = serde_json::from_str(text).map_err(|e| BrowserError::Protocol {
        method: method.to_owned(),
        message: format!("an answer that is not one: {e}"),
    })?;
    if let Some(err) = answer.error {
        return Err(BrowserError::Protocol {
            method: method.to_owned(),
            message: err
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("no message")
                .to_owned(),
        });
    }
    Ok(answer.result.unwrap_or(Value::Null))
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

    /// A connection whose first call got its answer after `count` copies
    /// of `event`.
    async fn flooded(event: Value, count: usize) -> Cdp<DuplexStream> {
        let (client, server) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move {
            let mut ws = tokio_tungstenite::accept_async(server).await.unwrap();
            let Some(Ok(Message::Text(text))) = ws.next().await else {
                return;
            };
            let cmd: Value = serde_json::from_str(&text).unwrap();
            let event = event.to_string();
            for _ in 0..count {
                ws.feed(Message::text(event.clone())).await.unwrap();
            }
            let answer = json!({"id": cmd["id"], "result": {}});
            ws.send(Message::text(answer.to_string())).await.unwrap();
        });
        let mut cdp = Cdp::handshake(client, 9222, "/devtools/browser/test")
            .await
            .unwrap();
        cdp.call(None, "Page.enable", json!({}), Duration::from_secs(30))
            .await
            .unwrap();
        cdp
    }

    #[tokio::test]
    async fn events_kept_while_a_call_waits_are_bounded() {
        // 40 MiB of events before the answer.
        let padding = "x".repeat(1 << 20);
        let event = json!({"method": "Log.entryAdded", "params": {"text": padding}});
        let mut cdp = flooded(event, 40).await;
        assert!(cdp.kept_bytes <= KEPT_EVENT_BYTES, "{}", cdp.kept_bytes);
        assert!(cdp.events.len() < 40 && !cdp.events.is_empty());
        let kept: usize = cdp.events.iter().map(|k| k.text.len()).sum();
        assert_eq!(kept, cdp.kept_bytes);
        // What is handed out is the newest, parsed.
        let event = cdp.next_event(Instant::now()).await.unwrap().unwrap();
        assert_eq!(event.method, "Log.entryAdded");
        assert_eq!(event.params["text"].as_str().unwrap().len(), 1 << 20);
    }

    #[tokio::test]
    async fn many_tiny_events_are_kept_to_a_count() {
        let tiny = json!({"method": "x", "params": [0, 0, 0, 0]});
        let cdp = flooded(tiny, KEPT_EVENTS + 500).await;
        assert_eq!(cdp.events.len(), KEPT_EVENTS);
    }

    #[tokio::test]
    async fn a_call_by_a_deadline_ends_there_though_the_browser_answers() {
        let mut cdp = browser(|m| (m == "Browser.getVersion").then_some(Duration::ZERO)).await;
        let began = Instant::now();
        let by = began + QUIET;
        let err = cdp
            .call_by(None, "Page.navigate", json!({}), by)
            .await
            .unwrap_err();
        assert!(matches!(err, BrowserError::Timeout { .. }), "{err}");
        assert!(began.elapsed() >= QUIET);
        assert!(began.elapsed() < stretched(QUIET), "not stretched");
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
