//! What a preview's request and answer carry across the proxy: the
//! client's headers as the guest gets them, and the guest's as the client
//! gets them (cookies kept to the preview, links and redirects under its
//! prefix, nothing that acts on the whole origin).

use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that belong to one connection, never forwarded (RFC 9110
/// 7.6.1); `Connection` and `Upgrade` are put back for an upgrade.
pub(super) const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// What the proxy says about the request itself; a client's own are
/// dropped, not passed on.
const FORWARDING: [&str; 6] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-proto",
];

/// Answer headers that act beyond one preview (every preview shares the
/// server's origin): a service worker's scope widened past its path, and
/// wiping the origin's storage.
const ORIGIN_WIDE: [&str; 2] = ["service-worker-allowed", "clear-site-data"];

/// How one preview's request and answer are rewritten.
pub(super) struct Rewrite<'a> {
    /// `/preview/<token>`, no trailing slash.
    pub prefix: &'a str,
    /// The guest port.
    pub port: u16,
    /// What this preview's cookies are named with (`c<id>_`).
    pub cookie_prefix: &'a str,
    /// Served on the preview's own origin (else on the server's, which
    /// every preview shares).
    pub own_origin: bool,
}

impl Rewrite<'_> {
    /// The client's headers as the guest gets them: no hop-by-hop or
    /// `Connection`-named headers, no `Authorization`, only this preview's
    /// cookies (without their prefix), `Host` and `Origin` the guest's own
    /// address, and the proxy's `X-Forwarded-*`.
    pub(super) fn request(&self, from: &HeaderMap) -> HeaderMap {
        let mut headers = from.clone();
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
        for name in FORWARDING {
            headers.remove(name);
        }
        headers.remove(header::AUTHORIZATION);
        headers.remove(header::COOKIE);
        let own: Vec<&str> = from
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().strip_prefix(self.cookie_prefix))
            .collect();
        if let Ok(cookies) = HeaderValue::from_str(&own.join("; ")) {
            if !own.is_empty() {
                headers.insert(header::COOKIE, cookies);
            }
        }
        if let Some(host) = from.get(header::HOST) {
            headers.insert(HeaderName::from_static("x-forwarded-host"), host.clone());
        }
        if let Ok(prefix) = HeaderValue::from_str(self.prefix) {
            headers.insert(HeaderName::from_static("x-forwarded-prefix"), prefix);
        }
        let own_address = format!("localhost:{}", self.port);
        if let Ok(host) = HeaderValue::from_str(&own_address) {
            headers.insert(header::HOST, host);
        }
        // The gate let it in; the guest's own checks (CSRF, WebSocket
        // origins) see it as their own page's.
        if headers.contains_key(header::ORIGIN) {
            if let Ok(origin) = HeaderValue::from_str(&format!("http://{own_address}")) {
                headers.insert(header::ORIGIN, origin);
            }
        }
        headers
    }

    /// The guest's answer headers as the client gets them (hop-by-hop
    /// ones already taken out by the caller).
    pub(super) fn answer(&self, headers: &mut HeaderMap) {
        for name in ORIGIN_WIDE {
            headers.remove(name);
        }
        self.hold_cookies(headers);
        if let Some(to) = headers
            .get(header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .and_then(|l| self.location(l))
        {
            headers.insert(header::LOCATION, to);
        }
        // The token is in the URL: no referrer leaves the preview. On its
        // own origin its own pages get it, so their requests carry their
        // real `Origin` (with `no-referrer` a browser sends `null` for a
        // POST), and the page keeps an agent cluster of its own whatever
        // the guest says (`document.domain` cannot join two previews).
        let policy = if self.own_origin {
            headers.insert(
                HeaderName::from_static("origin-agent-cluster"),
                HeaderValue::from_static("?1"),
            );
            "same-origin"
        } else {
            "no-referrer"
        };
        headers.insert(header::REFERRER_POLICY, HeaderValue::from_static(policy));
    }

    /// A redirect to the guest's own paths (`/x`, or its own address)
    /// kept under the prefix; elsewhere left as it is.
    fn location(&self, to: &str) -> Option<HeaderValue> {
        let own = [
            format!("http://localhost:{}", self.port),
            format!("http://127.0.0.1:{}", self.port),
        ];
        let path = own
            .iter()
            .find_map(|o| to.strip_prefix(o.as_str()))
            .or_else(|| (to.starts_with('/') && !to.starts_with("//")).then_some(to))?;
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        HeaderValue::from_str(&format!("{}{path}", self.prefix)).ok()
    }

    /// Each `Set-Cookie` named with this preview's prefix and held to its
    /// path (no `Domain`); one whose path tries to climb out is dropped.
    fn hold_cookies(&self, headers: &mut HeaderMap) {
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
            let Some(pair) = parts.next().filter(|p| !p.is_empty()) else {
                continue;
            };
            let mut path = "/".to_owned();
            let mut kept = vec![format!("{}{pair}", self.cookie_prefix)];
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
            let lowered = path.to_ascii_lowercase();
            if lowered.contains("..") || lowered.contains("%2e") || path.contains('\\') {
                continue;
            }
            let path = if path.starts_with('/') {
                path
            } else {
                format!("/{path}")
            };
            kept.push(format!("Path={}{path}", self.prefix));
            if let Ok(value) = HeaderValue::from_str(&kept.join("; ")) {
                headers.append(header::SET_COOKIE, value);
            }
        }
    }
}
