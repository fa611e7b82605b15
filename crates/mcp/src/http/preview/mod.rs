//! `/preview/<token>/...`: a preview URL (issue 61) served as a reverse
//! proxy to the guest port its token opens (`workspace::previews`), HTTP
//! and WebSocket (an `Upgrade` is passed through and the two connections
//! joined). The token is the capability: no bearer token is asked, the
//! gate's `Host` and `Origin` rules still apply. What reaches the guest
//! has the prefix taken off its path, no `Authorization` header (a client
//! that sends the MCP token sends it to the server, never to a guest) and
//! `X-Forwarded-*` headers saying where it came from; what comes back has
//! its cookies held to the preview's path (previews share the server's
//! origin: one guest's cookies must not reach another's app) and no
//! referrer leaves with its links (the token is in the URL).

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{plain, Body};
use workspace::previews::PREVIEW_PATH;
use workspace::Workspaces;

/// Headers that belong to one connection, never forwarded (RFC 9110
/// 7.6.1); `Connection` and `Upgrade` are put back for an upgrade.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether `path` is a preview's.
pub(super) fn is_preview(path: &str) -> bool {
    path.starts_with(PREVIEW_PATH) || path == PREVIEW_PATH.trim_end_matches('/')
}

/// Serves one request under [`PREVIEW_PATH`] (the gate's `Host` and
/// `Origin` checks passed).
pub(super) async fn serve(ws: &Workspaces, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let rest = path.strip_prefix(PREVIEW_PATH).unwrap_or_default();
    let (token, tail) = match rest.split_once('/') {
        Some((token, tail)) => (token, Some(tail)),
        None => (rest, None),
    };
    let target = match ws.preview_target(token) {
        Ok(Some(target)) => target,
        Ok(None) => return not_found(),
        Err(e) => {
            tracing::warn!("looking a preview up: {}", e.full_message());
            return not_found();
        }
    };
    let prefix = format!("{PREVIEW_PATH}{token}");
    let Some(tail) = tail else {
        // Relative links of the app resolve under the prefix only with
        // its slash.
        let query = req
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        let mut moved = plain(308, "moved\n".into());
        if let Ok(to) = HeaderValue::from_str(&format!("{prefix}/{query}")) {
            moved.headers_mut().insert(header::LOCATION, to);
        }
        return moved;
    };
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
                    "nothing answers on port {} of the workspace: {}\n",
                    target.port,
                    e.full_message()
                ),
            );
        }
    };
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    forward(
        req,
        &format!("/{tail}{query}"),
        &prefix,
        target.port,
        stream,
    )
    .await
}

fn not_found() -> Response<Body> {
    plain(
        404,
        "no such preview (it may have expired or been revoked)\n".into(),
    )
}

/// Sends `req` to the server at the other end of `stream` as `path`
/// (with its query), and its answer back; an upgrade joins the two
/// connections once both sides have switched.
pub(super) async fn forward<S>(
    mut req: Request<Incoming>,
    path: &str,
    prefix: &str,
    port: u16,
    stream: S,
) -> Response<Body>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let upgrade = req.headers().get(header::UPGRADE).cloned();
    let from_client = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut out = Request::builder().method(parts.method).uri(path);
    if let Some(headers) = out.headers_mut() {
        *headers = forwarded_headers(&parts.headers, prefix, port);
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
        Err(e) => return plain(502, format!("the guest's server: {e}\n")),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("preview connection: {e}");
        }
    });
    let mut answer = match sender.send_request(out).await {
        Ok(answer) => answer,
        Err(e) => return plain(502, format!("the guest's server did not answer: {e}\n")),
    };
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(from_client) = from_client {
            let from_guest = hyper::upgrade::on(&mut answer);
            tokio::spawn(async move {
                if let (Ok(client), Ok(guest)) = (from_client.await, from_guest.await) {
                    let (mut client, mut guest) = (TokioIo::new(client), TokioIo::new(guest));
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut guest).await;
                }
            });
        }
    }
    let (mut parts, body) = answer.into_parts();
    let switching = parts.status == StatusCode::SWITCHING_PROTOCOLS;
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
    hold_cookies_to(&mut parts.headers, prefix);
    parts.headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    Response::from_parts(parts, body.map_err(Into::into).boxed())
}

/// The client's headers as the guest gets them.
fn forwarded_headers(from: &HeaderMap, prefix: &str, port: u16) -> HeaderMap {
    let mut headers = from.clone();
    // Whatever `Connection` names is this connection's too.
    let named: Vec<HeaderName> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&named) {
        headers.remove(name);
    }
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::HOST);
    if let Some(host) = from.get(header::HOST) {
        headers.insert(HeaderName::from_static("x-forwarded-host"), host.clone());
    }
    if let Ok(prefix) = HeaderValue::from_str(prefix) {
        headers.insert(HeaderName::from_static("x-forwarded-prefix"), prefix);
    }
    if let Ok(host) = HeaderValue::from_str(&format!("localhost:{port}")) {
        headers.insert(header::HOST, host);
    }
    headers
}

/// Rewrites each `Set-Cookie` so that the browser sends it back to this
/// preview only: its `Path` under `prefix`, no `Domain`.
fn hold_cookies_to(headers: &mut HeaderMap, prefix: &str) {
    let cookies: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .cloned()
        .collect();
    headers.remove(header::SET_COOKIE);
    for cookie in cookies {
        let Ok(text) = cookie.to_str() else {
            continue;
        };
        let mut parts = text.split(';').map(str::trim);
        let Some(pair) = parts.next() else {
            continue;
        };
        let mut path = "/".to_owned();
        let mut kept = vec![pair.to_owned()];
        for attribute in parts {
            let name = attribute.split('=').next().unwrap_or_default().trim();
            if name.eq_ignore_ascii_case("path") {
                path = attribute
                    .split_once('=')
                    .map_or("/", |(_, p)| p.trim())
                    .to_owned();
            } else if !name.eq_ignore_ascii_case("domain") {
                kept.push(attribute.to_owned());
            }
        }
        let path = if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        };
        kept.push(format!("Path={prefix}{path}"));
        if let Ok(value) = HeaderValue::from_str(&kept.join("; ")) {
            headers.append(header::SET_COOKIE, value);
        }
    }
}

#[cfg(test)]
mod tests;
