//! What a request must pass before it reaches the MCP server: its `Host`
//! and `Origin` name this server (DNS-rebinding protection: a web page
//! that rebinds its own name to 127.0.0.1 still sends its name), then its
//! bearer token matches. The first failure answers: 403, then 401.

use std::net::{IpAddr, SocketAddr};

use hyper::header::{HeaderMap, AUTHORIZATION, HOST, ORIGIN};
use workspace::store::previews::is_origin_label;

/// Why a request is turned away.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// `Host` is missing or names another server.
    #[error("the Host header {0:?} does not name this server")]
    Host(String),
    /// `Origin` names a site that is not allowed.
    #[error("the Origin {0:?} is not allowed")]
    Origin(String),
    /// No `Authorization: Bearer` header.
    #[error("no bearer token: send Authorization: Bearer <token>")]
    NoToken,
    /// A token that is not this server's.
    #[error("the bearer token is wrong")]
    WrongToken,
}

impl Refusal {
    /// The HTTP status it is answered with.
    pub fn status(&self) -> u16 {
        match self {
            Self::Host(_) | Self::Origin(_) => 403,
            Self::NoToken | Self::WrongToken => 401,
        }
    }
}

/// The checks of one server.
#[derive(Debug, Clone)]
pub struct Gate {
    /// Host names (lowercase, without port) requests may name.
    hosts: Vec<String>,
    /// The server's port: a `Host` with another port is refused.
    port: u16,
    /// Origins (`scheme://host[:port]`, lowercase) allowed besides this
    /// server's own.
    origins: Vec<String>,
    /// The token; none with `--dev`.
    token: Option<String>,
    /// The domain previews' own host names are under (`<label>.<domain>`),
    /// when they have their own origins.
    preview_domain: Option<String>,
}

impl Gate {
    /// The gate of a server listening on `bind`: requests may name its
    /// address (and `localhost` when it is a loopback one) or the host of
    /// an allowed origin.
    pub fn new(bind: SocketAddr, origins: &[String], token: Option<String>) -> Self {
        let mut hosts = vec![bracketless(&bind.ip().to_string())];
        if bind.ip().is_loopback() {
            hosts.extend(["localhost", "127.0.0.1", "::1"].map(String::from));
        }
        let origins: Vec<String> = origins
            .iter()
            .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
            .collect();
        for o in &origins {
            if let Some((host, _)) = origin_authority(o) {
                hosts.push(host);
            }
        }
        hosts.sort();
        hosts.dedup();
        Self {
            hosts,
            port: bind.port(),
            origins,
            token,
            preview_domain: None,
        }
    }

    /// The same gate, taking `<label>.<domain>` as a preview's own host
    /// name (a label of [`is_origin_label`]'s form: no other name under
    /// `domain` is taken).
    pub fn with_preview_domain(mut self, domain: Option<String>) -> Self {
        self.preview_domain = domain.map(|d| d.to_ascii_lowercase());
        self
    }

    /// The origin label of the preview whose own host name `headers`
    /// give (`Host: <label>.<domain>[:port]`, this server's port), if
    /// they give one: such a request is for that preview alone.
    pub fn preview_host(&self, headers: &HeaderMap) -> Option<String> {
        let domain = self.preview_domain.as_deref()?;
        let host = headers.get(HOST)?.to_str().ok()?;
        let (name, port) = split_authority(host)?;
        if port.is_some_and(|p| p != self.port) {
            return None;
        }
        let label = name.strip_suffix(domain)?.strip_suffix('.')?;
        is_origin_label(label).then(|| label.to_owned())
    }

    /// Whether a request to the preview of `label`'s own origin comes
    /// from that origin or an allowed one (`Origin`, when sent): another
    /// preview's pages, or this server's own, are refused.
    pub fn check_preview_origin(&self, headers: &HeaderMap, label: &str) -> Result<(), Refusal> {
        let Some(origin) = headers.get(ORIGIN) else {
            return Ok(());
        };
        let origin = origin.to_str().unwrap_or("<not text>");
        // A sandboxed page's (an app's own sandboxed frame): the token in
        // the path is the access, as for a request with no `Origin`.
        if origin == "null" {
            return Ok(());
        }
        let lowered = origin.trim_end_matches('/').to_ascii_lowercase();
        let own = self
            .preview_domain
            .as_deref()
            .map(|domain| format!("{label}.{domain}"));
        let from_itself = matches!(
            (origin_authority(&lowered), own),
            (Some((host, port)), Some(own)) if host == own && port == self.port
        );
        if from_itself || self.origins.contains(&lowered) {
            Ok(())
        } else {
            Err(Refusal::Origin(origin.to_owned()))
        }
    }

    /// Whether a request to the MCP endpoint with `headers` may go on:
    /// [`Gate::check_site`], then the token (which a guest's page served
    /// on this origin, `/preview/`, does not have: a server without one
    /// serves no previews).
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        self.check_site(headers)?;
        let Some(token) = &self.token else {
            return Ok(());
        };
        let given = headers
            .get(AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| {
                let (scheme, value) = h.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| value.trim())
            })
            .ok_or(Refusal::NoToken)?;
        if same_secret(given.as_bytes(), token.as_bytes()) {
            Ok(())
        } else {
            Err(Refusal::WrongToken)
        }
    }

    /// Whether `headers` name this server (`Host`) and come from an
    /// allowed site (`Origin`, when sent): this server's own or one it
    /// was told to allow.
    pub fn check_site(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        self.check_site_from(headers, false)
    }

    /// Whether a request for a preview on the server's own origin may go
    /// on: as [`Gate::check_site`], and also from a page of no origin
    /// (`Origin: null`: every page a browser sandboxes there, whose
    /// requests the token in the path opens; `/mcp` refuses them).
    pub fn check_preview_site(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        self.check_site_from(headers, true)
    }

    /// [`Gate::check_site`], taking `Origin: null` when `null_too`.
    fn check_site_from(&self, headers: &HeaderMap, null_too: bool) -> Result<(), Refusal> {
        let host = headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        if !self.allows_host(host) {
            return Err(Refusal::Host(host.to_owned()));
        }
        if let Some(origin) = headers.get(ORIGIN) {
            let origin = origin.to_str().unwrap_or("<not text>");
            let sandboxed = null_too && origin == "null";
            if !sandboxed && !self.allows_origin(origin) {
                return Err(Refusal::Origin(origin.to_owned()));
            }
        }
        Ok(())
    }

    fn allows_host(&self, host: &str) -> bool {
        let Some((name, port)) = split_authority(host) else {
            return false;
        };
        self.hosts.contains(&name) && port.is_none_or(|p| p == self.port)
    }

    fn allows_origin(&self, origin: &str) -> bool {
        let origin = origin.trim_end_matches('/').to_ascii_lowercase();
        if self.origins.contains(&origin) {
            return true;
        }
        match origin_authority(&origin) {
            Some((host, port)) => self.hosts.contains(&host) && port == self.port,
            None => false,
        }
    }
}

/// The host and port of `scheme://host[:port]` (without one, its
/// scheme's: an origin on port 80 is not one on the server's port).
fn origin_authority(origin: &str) -> Option<(String, u16)> {
    let (scheme, rest) = origin.split_once("://")?;
    let default = match scheme {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let (host, port) = split_authority(rest)?;
    Some((host, port.unwrap_or(default)))
}

/// A `Host` value as (lowercase name without brackets, port).
fn split_authority(authority: &str) -> Option<(String, Option<u16>)> {
    if authority.is_empty() || authority.contains(['/', '@', ' ']) {
        return None;
    }
    if let Some(rest) = authority.strip_prefix('[') {
        let (ip, after) = rest.split_once(']')?;
        ip.parse::<IpAddr>().ok()?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((ip.to_ascii_lowercase(), port));
    }
    // A bare IPv6 address has colons and no port.
    if authority.parse::<std::net::Ipv6Addr>().is_ok() {
        return Some((authority.to_ascii_lowercase(), None));
    }
    match authority.rsplit_once(':') {
        Some((name, port)) => Some((name.to_ascii_lowercase(), Some(port.parse().ok()?))),
        None => Some((authority.to_ascii_lowercase(), None)),
    }
}

/// Whether `name` is a DNS name previews' host names can go under: dot
/// separated labels of letters, digits and inner hyphens, not an address,
/// with room for a preview's label before it.
pub(crate) fn is_domain(name: &str) -> bool {
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    // One label alone (`com`) is a top-level domain, not one's own; but
    // for `localhost`, which never leaves the machine.
    name.len() <= 200
        && (name.contains('.') || name.eq_ignore_ascii_case("localhost"))
        && name.split('.').all(label)
        && name.parse::<IpAddr>().is_err()
        && !name
            .rsplit('.')
            .next()
            .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
}

fn bracketless(ip: &str) -> String {
    ip.trim_matches(['[', ']']).to_ascii_lowercase()
}

/// Compares without stopping at the first difference, so the time taken
/// does not tell how much of a guess was right.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn loopback(token: Option<&str>) -> Gate {
        Gate::new(
            "127.0.0.1:8765".parse().unwrap(),
            &["https://app.example.com".to_string()],
            token.map(String::from),
        )
    }

    #[test]
    fn a_loopback_server_takes_its_own_names_and_port() {
        let g = loopback(None);
        for host in [
            "127.0.0.1:8765",
            "localhost:8765",
            "LOCALHOST",
            "[::1]:8765",
        ] {
            assert_eq!(g.check(&headers(&[("host", host)])), Ok(()), "{host}");
        }
        for host in [
            "evil.example:8765",
            "127.0.0.1:80",
            "",
            "127.0.0.1:x",
            "a@127.0.0.1",
        ] {
            assert_eq!(
                g.check(&headers(&[("host", host)])),
                Err(Refusal::Host(host.into())),
                "{host}"
            );
        }
    }

    #[test]
    fn origins_must_be_the_server_or_allowed() {
        let g = loopback(None);
        // Its own origin and allowed ones (the MCP conformance suite's
        // `dns-rebinding-protection` sends the former).
        let h = headers(&[
            ("host", "127.0.0.1:8765"),
            ("origin", "https://app.example.com/"),
        ]);
        assert_eq!(g.check(&h), Ok(()));
        for own in ["http://localhost:8765", "http://127.0.0.1:8765"] {
            let h = headers(&[("host", "127.0.0.1:8765"), ("origin", own)]);
            assert_eq!(g.check(&h), Ok(()), "{own}");
            assert_eq!(g.check_site(&h), Ok(()), "{own}");
        }
        for origin in [
            "http://evil.example",
            "http://localhost:9999",
            "http://localhost",
            "https://127.0.0.1",
            "null",
            "file://x",
        ] {
            let h = headers(&[("host", "127.0.0.1:8765"), ("origin", origin)]);
            assert_eq!(g.check(&h).unwrap_err().status(), 403, "{origin}");
            assert_eq!(g.check_site(&h).unwrap_err().status(), 403, "{origin}");
        }
        // A page the browser sandboxed on the server's origin reaches a
        // preview there (its token is the access), never /mcp.
        let sandboxed = headers(&[("host", "127.0.0.1:8765"), ("origin", "null")]);
        assert_eq!(g.check_preview_site(&sandboxed), Ok(()));
        let elsewhere = headers(&[
            ("host", "127.0.0.1:8765"),
            ("origin", "http://evil.example"),
        ]);
        assert!(g.check_preview_site(&elsewhere).is_err());
        let rebound = headers(&[("host", "evil.example"), ("origin", "null")]);
        assert!(g.check_preview_site(&rebound).is_err());
    }

    #[test]
    fn the_token_is_checked_after_the_host() {
        let g = loopback(Some("s3cret"));
        let host = ("host", "127.0.0.1:8765");
        assert_eq!(g.check(&headers(&[host])), Err(Refusal::NoToken));
        let wrong = headers(&[host, ("authorization", "Bearer nope")]);
        assert_eq!(g.check(&wrong), Err(Refusal::WrongToken));
        let basic = headers(&[host, ("authorization", "Basic s3cret")]);
        assert_eq!(g.check(&basic), Err(Refusal::NoToken));
        let right = headers(&[host, ("authorization", "bearer s3cret")]);
        assert_eq!(g.check(&right), Ok(()));
        // A foreign Host is 403 whatever the token.
        let rebound = headers(&[("host", "evil.example"), ("authorization", "Bearer s3cret")]);
        assert_eq!(g.check(&rebound).unwrap_err().status(), 403);
    }

    #[test]
    fn a_previews_own_host_names_that_preview_alone() {
        let label = format!("pv{}", "0123456789abcdef");
        let plain = loopback(None);
        let own = |host: &str| headers(&[("host", host)]);
        // Without a preview domain no host is a preview's.
        assert_eq!(
            plain.preview_host(&own(&format!("{label}.localhost:8765"))),
            None
        );
        let g = loopback(None).with_preview_domain(Some("LocalHost".into()));
        for host in [
            format!("{label}.localhost:8765"),
            format!("{label}.LOCALHOST"),
        ] {
            assert_eq!(g.preview_host(&own(&host)), Some(label.clone()), "{host}");
        }
        for host in [
            format!("{label}.localhost:9999"),
            format!("x.{label}.localhost:8765"),
            format!("{label}localhost:8765"),
            "pv0123.localhost:8765".to_owned(),
            "localhost:8765".to_owned(),
            format!("{label}.evil.example:8765"),
        ] {
            assert_eq!(g.preview_host(&own(&host)), None, "{host}");
        }
        // A preview's own host is not the server's: /mcp refuses it.
        assert!(g.check(&own(&format!("{label}.localhost:8765"))).is_err());
        // Its requests come from itself, an allowed origin, or no page.
        let from = |origin: &str| {
            headers(&[
                ("host", &format!("{label}.localhost:8765")),
                ("origin", origin),
            ])
        };
        for origin in [
            format!("http://{label}.localhost:8765"),
            format!("HTTP://{label}.localhost:8765/"),
            "https://app.example.com".to_owned(),
        ] {
            assert_eq!(
                g.check_preview_origin(&from(&origin), &label),
                Ok(()),
                "{origin}"
            );
        }
        assert_eq!(g.check_preview_origin(&own("x"), &label), Ok(()));
        // A sandboxed frame of its own app: the token is the access.
        assert_eq!(g.check_preview_origin(&from("null"), &label), Ok(()));
        for origin in [
            "http://pvfedcba9876543210.localhost:8765",
            "http://127.0.0.1:8765",
            "http://localhost:8765",
            // Without a port: port 80's page, not this server's.
            &format!("http://{label}.localhost"),
        ] {
            assert_eq!(
                g.check_preview_origin(&from(origin), &label),
                Err(Refusal::Origin(origin.into())),
                "{origin}"
            );
        }
        assert!(g
            .check_preview_origin(&from(&format!("http://{label}.localhost:1")), &label)
            .is_err());
    }

    #[test]
    fn preview_domains_are_dns_names() {
        for ok in ["localhost", "previews.example.com", "a-b.x1"] {
            assert!(is_domain(ok), "{ok}");
        }
        for bad in ["com", "example"] {
            assert!(!is_domain(bad), "{bad}");
        }
        assert!(is_domain("LocalHost"));
        let long = "a".repeat(64);
        for bad in [
            "",
            ".",
            "a..b",
            "-a.b",
            "a-.b",
            "127.0.0.1",
            "10.1",
            "a/b",
            "a b",
            "a:1",
            long.as_str(),
            "*.example.com",
        ] {
            assert!(!is_domain(bad), "{bad}");
        }
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"abcd"));
    }
}
