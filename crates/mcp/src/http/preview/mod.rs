//! `/preview/<token>/...`: a preview URL (issue 61) served as a reverse
//! proxy to the guest port its token opens (`workspace::previews`), HTTP
//! and WebSocket (an `Upgrade` is passed through and the two connections
//! joined, while the preview lasts, at most [`MAX_TUNNELS`] at once). The
//! token is the capability: no bearer token is asked, the gate's `Host`
//! and `Origin` rules still apply. Each preview has an origin of its own
//! (`<label>.<domain>`, the label from its token's digest), which serves
//! it alone; on the server's own origin, shared by every preview, its
//! pages are sandboxed (an opaque origin: no storage, script cookies or
//! same-origin calls). Either way what crosses is rewritten (`headers`):
//! the guest gets its path without the prefix, no `Authorization` and
//! only its own preview's cookies; the client gets cookies and redirects
//! held to the preview, no header that acts on the whole origin, and no
//! referrer leaves the preview with its links (the token is in the URL).
//! A service worker is never served.

mod headers;

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;

use super::{plain, Body};
use headers::{Rewrite, HOP_BY_HOP};
use workspace::previews::PREVIEW_PATH;
use workspace::store::previews::{cookie_prefix, origin_label};
use workspace::Workspaces;

/// Upgraded connections (WebSockets) open at once through a server's
/// previews: each holds a client socket and a guest connection beyond the
/// HTTP connection limits, so they have a bound of their own.
const MAX_TUNNELS: usize = 256;
static TUNNELS: Semaphore = Semaphore::const_new(MAX_TUNNELS);
/// How often an upgraded connection looks whether its preview still
/// exists (revoked or expired: it is closed).
const RECHECK: Duration = Duration::from_secs(15);
/// How long the guest's server has to answer a request's header.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether `path` is a preview's.
pub(super) fn is_preview(path: &str) -> bool {
    path.starts_with(PREVIEW_PATH) || path == PREVIEW_PATH.trim_end_matches('/')
}

/// What a page of a preview served on the server's shared origin may do:
/// anything but be of that origin (no `allow-same-origin`).
const SANDBOX: &str = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/// Serves one request for a preview (the gate's `Host` and `Origin`
/// checks passed): on the preview's own origin, `own` is its label and
/// only its token is served there; else on the server's, sandboxed.
pub(super) async fn serve(
    ws: &Workspaces,
    req: Request<Incoming>,
    own: Option<&str>,
) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let Some(rest) = path.strip_prefix(PREVIEW_PATH) else {
        return not_found();
    };
    let (token, tail) = match rest.split_once('/') {
        Some((token, tail)) => (token, Some(tail)),
        None => (rest, None),
    };
    if !served_here(own, token) {
        return not_found();
    }
    let mut answer = serve_token(ws, req, token, tail, own.is_some()).await;
    if own.is_none() {
        sandbox(answer.headers_mut());
    }
    answer
}

/// Whether the preview of `token` is served on the origin of label
/// `own` (none: the server's, which serves every preview).
fn served_here(own: Option<&str>, token: &str) -> bool {
    own.is_none_or(|label| origin_label(token).as_deref() == Some(label))
}

/// Sandboxes the page an answer on the server's shared origin makes:
/// appended after the guest's own policies, so that of several `sandbox`
/// directives ours, the last, is the one in force (and a policy only
/// narrows what the others allow).
fn sandbox(headers: &mut hyper::HeaderMap) {
    headers.append(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(SANDBOX),
    );
}

/// Serves `tail` (none: the prefix without its slash) of the preview
/// `token` opens.
async fn serve_token(
    ws: &Workspaces,
    req: Request<Incoming>,
    token: &str,
    tail: Option<&str>,
    own_origin: bool,
) -> Response<Body> {
    let target = match ws.preview_target(token) {
        Ok(Some(target)) => target,
        Ok(None) => return not_found(),
        Err(e) => {
            tracing::warn!("looking a preview up: {}", e.full_message());
            return not_found();
        }
    };
    let prefix = format!("{PREVIEW_PATH}{token}");
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let Some(tail) = tail else {
        // Relative links of the app resolve under the prefix only with
        // its slash.
        let mut moved = plain(308, "moved\n".into());
        if let Ok(to) = HeaderValue::from_str(&format!("{prefix}/{query}")) {
            moved.headers_mut().insert(header::LOCATION, to);
        }
        return moved;
    };
    // A service worker registered here would serve every preview's pages.
    if req.headers().contains_key("service-worker") {
        return plain(403, "previews do not serve service workers\n".into());
    }
    // Dot segments are for the client to resolve, never the guest.
    let tail = tail.trim_start_matches('/');
    if tail.split('/').any(|s| s == ".." || s == ".") {
        return plain(400, "a path with dot segments\n".into());
    }
    let stream = match ws.open_preview(&target).await {
        Ok(stream) => stream,
        Err(e) => {
            tracing::info!(
                "preview of {} port {}: {}",
                target.workspace,
                target.port,
                e.full_message()
            );
            return plain(
                502,
                format!(
                    "nothing answers on the previewed port {} (is the app listening on the guest's 127.0.0.1?)\n",
                    target.port
                ),
            );
        }
    };
    let cookie_prefix = cookie_prefix(token).unwrap_or_default();
    let rewrite = Rewrite {
        prefix: &prefix,
        port: target.port,
        cookie_prefix: &cookie_prefix,
        own_origin,
    };
    let (ws, token) = (ws.clone(), token.to_owned());
    let alive = move || matches!(ws.preview_target(&token), Ok(Some(_)));
    forward(req, &format!("/{tail}{query}"), &rewrite, stream, alive).await
}

fn not_found() -> Response<Body> {
    plain(
        404,
        "no such preview (it may have expired or been revoked)\n".into(),
    )
}

/// Sends `req` to the server at the other end of `stream` as `path`
/// (with its query), and its answer back; an upgrade joins the two
/// connections once both sides have switched, for as long as `alive`
/// says the preview exists.
async fn forward<S>(
    mut req: Request<Incoming>,
    path: &str,
    rewrite: &Rewrite<'_>,
    stream: S,
    alive: impl Fn() -> bool + Send + 'static,
) -> Response<Body>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let upgrade = req.headers().get(header::UPGRADE).cloned();
    let permit = match upgrade {
        Some(_) => match TUNNELS.try_acquire() {
            Ok(permit) => Some(permit),
            Err(_) => {
                return plain(
                    503,
                    format!("{MAX_TUNNELS} upgraded preview connections are open; try later\n"),
                )
            }
        },
        None => None,
    };
    let from_client = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut out = Request::builder().method(parts.method).uri(path);
    if let Some(headers) = out.headers_mut() {
        *headers = rewrite.request(&parts.headers);
        if let Some(protocol) = &upgrade {
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, protocol.clone());
        }
    }
    let Ok(out) = out.body(body) else {
        return plain(400, "a request that cannot be forwarded\n".into());
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!("preview handshake: {e}");
            return plain(502, "the guest's server did not take the request\n".into());
        }
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("preview connection: {e}");
        }
    });
    let mut answer = match tokio::time::timeout(ANSWER_TIMEOUT, sender.send_request(out)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => {
            tracing::debug!("preview answer: {e}");
            return plain(502, "the guest's server did not answer\n".into());
        }
        Err(_) => return plain(504, "the guest's server did not answer in time\n".into()),
    };
    let switching = answer.status() == StatusCode::SWITCHING_PROTOCOLS;
    if let (true, Some(from_client), Some(permit)) = (switching, from_client, permit) {
        let from_guest = hyper::upgrade::on(&mut answer);
        tokio::spawn(async move {
            let _permit = permit;
            let (Ok(client), Ok(guest)) = (from_client.await, from_guest.await) else {
                return;
            };
            let (mut client, mut guest) = (TokioIo::new(client), TokioIo::new(guest));
            let joined = tokio::io::copy_bidirectional(&mut client, &mut guest);
            tokio::pin!(joined);
            loop {
                tokio::select! {
                    _ = &mut joined => break,
                    () = tokio::time::sleep(RECHECK) => if !alive() { break },
                }
            }
        });
    }
    let (mut parts, body) = answer.into_parts();
    let upgrade_to = parts.headers.get(header::UPGRADE).cloned();
    for name in &HOP_BY_HOP {
        parts.headers.remove(name);
    }
    if switching {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(to) = upgrade_to {
            parts.headers.insert(header::UPGRADE, to);
        }
    }
    rewrite.answer(&mut parts.headers);
    Response::from_parts(parts, body.map_err(Into::into).boxed())
}

#[cfg(test)]
mod tests;
