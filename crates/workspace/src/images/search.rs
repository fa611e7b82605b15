//! `image search`: images by name or description here (registered ones,
//! and the built-in ones `cargo xtask setup` builds, registered at first
//! use), and repositories of registries that list theirs
//! (`GET /v2/_catalog`): those named in `config.json`'s
//! `search_registries` and those the caller names. Docker Hub offers no
//! catalog; a registry that cannot be listed is reported, not fatal.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::images::pull::on_loopback;
use base::code::ErrorCode;
use base::images::{ImageError, ImageRegistry, BUILTIN_IMAGES};

/// Why a search could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// A registry or the set of them is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The local images could not be read.
    #[error(transparent)]
    Images(#[from] ImageError),
}

impl crate::error::ConcernError for SearchError {
    fn code(&self) -> ErrorCode {
        match self {
            SearchError::Invalid(_) => ErrorCode::InvalidInput,
            SearchError::Images(e) => e.code(),
        }
    }
}

impl From<SearchError> for crate::error::Error {
    fn from(e: SearchError) -> Self {
        crate::error::Error::Search(crate::error::ConcernFailure::new(e))
    }
}

/// The `config.json` key listing registries to search.
pub const SEARCH_REGISTRIES_KEY: &str = "search_registries";
/// Most repositories asked of one registry.
const CATALOG_PAGE: usize = 1000;
/// Largest catalog answer read.
const MAX_CATALOG_BYTES: usize = 1 << 20;
/// How long a registry may take to answer.
const CATALOG_TIMEOUT: Duration = Duration::from_secs(10);
/// Most registries one search asks.
const MAX_REGISTRIES: usize = 8;

/// What a search found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct SearchResults {
    /// Images here, by name.
    pub local: Vec<LocalImage>,
    /// Repositories of the registries searched.
    pub remote: Vec<RemoteImage>,
    /// Registries that could not be listed, and why.
    pub unreachable: Vec<RegistryProblem>,
}

/// An image here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct LocalImage {
    /// Its name (what `--image` takes).
    pub name: String,
    /// What it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// False for a built-in image not registered yet (it is at first use,
    /// once `microagent setup` built it).
    pub registered: bool,
}

/// A repository of a registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct RemoteImage {
    /// The registry (`host[:port]`).
    pub registry: String,
    /// The repository in it.
    pub repository: String,
    /// What `--image` or `image pull` takes (the `latest` tag unless one
    /// is added).
    pub reference: String,
}

/// A registry that could not be listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub struct RegistryProblem {
    /// The registry.
    pub registry: String,
    /// What went wrong.
    pub message: String,
}

/// What the built-in images are.
fn builtin_description(name: &str) -> &'static str {
    match name {
        "minimal" => "busybox userland (sh and the common tools); the default image",
        _ => "Debian bookworm with Python 3, Node.js, git and apt",
    }
}

fn matches(query: &str, fields: &[Option<&str>]) -> bool {
    let query = query.to_lowercase();
    fields
        .iter()
        .flatten()
        .any(|f| f.to_lowercase().contains(&query))
}

/// Images here whose name or description contains `query` (any case; an
/// empty query matches all).
pub fn search_local(images: &ImageRegistry, query: &str) -> Result<Vec<LocalImage>, ImageError> {
    let mut out: Vec<LocalImage> = images
        .list()?
        .into_iter()
        .filter(|i| matches(query, &[Some(&i.name), i.description.as_deref()]))
        .map(|i| LocalImage {
            name: i.name,
            description: i.description,
            registered: true,
        })
        .collect();
    for name in BUILTIN_IMAGES {
        let description = builtin_description(name);
        if !out.iter().any(|i| i.name == name) && matches(query, &[Some(name), Some(description)]) {
            out.push(LocalImage {
                name: name.to_owned(),
                description: Some(description.to_owned()),
                registered: false,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The registries `config.json` in `state_root` lists to search.
pub fn configured_registries(state_root: &Path) -> Vec<String> {
    // A broken file adds none here; `estimate_cost` and `task run`, which
    // read it too, say what is wrong with it.
    base::host::settings::config_section(state_root, SEARCH_REGISTRIES_KEY)
        .ok()
        .flatten()
        .map(|(registries, _)| registries)
        .unwrap_or_default()
}

/// Checks a registry's form: `host` or `host:port`, nothing more.
pub fn check_registry(registry: &str) -> Result<(), SearchError> {
    let (host, port) = registry.rsplit_once(':').unwrap_or((registry, ""));
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-[]:".contains(c));
    if host_ok && port.chars().all(|c| c.is_ascii_digit()) {
        return Ok(());
    }
    Err(SearchError::Invalid(format!(
        "registry {registry:?}: give host or host:port, e.g. 127.0.0.1:5000 or ghcr.io"
    )))
}

/// Repositories of `registry` whose name contains `query`.
async fn search_registry(registry: &str, query: &str) -> Result<Vec<RemoteImage>, String> {
    // Loopback registries are plain HTTP, as for pulls.
    let scheme = if on_loopback(&format!("{registry}/x")) {
        "http"
    } else {
        "https"
    };
    let url = format!("{scheme}://{registry}/v2/_catalog?n={CATALOG_PAGE}");
    // reqwest is built without a TLS provider of its own; a search made
    // before any pull in this process would panic building its client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(CATALOG_TIMEOUT)
        .build()
        .map_err(|e| e.to_string())?;
    let mut answer = http
        .get(&url)
        .send()
        .await
        .map_err(|e| format!("{url}: {}", base::error_chain::error_chain(&e)))?;
    if !answer.status().is_success() {
        return Err(format!(
            "{url} answered {}: the registry does not list its repositories",
            answer.status()
        ));
    }
    let mut body = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(|e| e.to_string())? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_CATALOG_BYTES {
            return Err(format!(
                "{url}: the catalog is over {MAX_CATALOG_BYTES} bytes"
            ));
        }
    }
    let catalog: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("{url}: not a catalog: {e}"))?;
    Ok(catalog["repositories"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str())
        .filter(|r| matches(query, &[Some(r)]))
        .map(|repository| RemoteImage {
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            reference: format!("{registry}/{repository}"),
        })
        .collect())
}

/// Searches here, then each of `registries` (at most 8; configured ones
/// first, repeats dropped).
pub async fn search(
    images: &ImageRegistry,
    query: &str,
    registries: &[String],
) -> Result<SearchResults, SearchError> {
    let mut unique: Vec<&String> = Vec::new();
    for r in registries {
        check_registry(r)?;
        if !unique.contains(&r) {
            unique.push(r);
        }
    }
    if unique.len() > MAX_REGISTRIES {
        return Err(SearchError::Invalid(format!(
            "{} registries; a search asks at most {MAX_REGISTRIES}",
            unique.len()
        )));
    }
    let mut results = SearchResults {
        local: search_local(images, query)?,
        ..SearchResults::default()
    };
    for registry in unique {
        match search_registry(registry, query).await {
            Ok(found) => results.remote.extend(found),
            Err(message) => results.unreachable.push(RegistryProblem {
                registry: registry.clone(),
                message,
            }),
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_match_names_and_descriptions_in_any_case() {
        assert!(matches("PY", &[Some("python-3-12"), None]));
        assert!(matches("node", &[Some("x"), Some("with Node.js")]));
        assert!(matches("", &[Some("x")]));
        assert!(!matches("rust", &[Some("x"), Some("busybox")]));
    }

    #[test]
    fn registries_are_hosts_with_an_optional_port() {
        for good in ["127.0.0.1:5000", "ghcr.io", "localhost:5000", "[::1]:5000"] {
            assert!(check_registry(good).is_ok(), "{good}");
        }
        for bad in ["", "http://x", "x/y", "x:port", "a b"] {
            assert!(check_registry(bad).is_err(), "{bad}");
        }
    }

    /// A registry on loopback that answers every request with `head` and
    /// then `body` repeated until the client hangs up (`endless`) or once.
    async fn hostile_registry(body: Vec<u8>, endless: bool) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = conn.read(&mut request).await;
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
                    if conn.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    while conn.write_all(&body).await.is_ok() && endless {}
                });
            }
        });
        addr.to_string()
    }

    #[tokio::test]
    async fn a_hostile_catalog_is_refused_at_its_bound_or_read_as_data() {
        // Without end: stops past MAX_CATALOG_BYTES, not at the host's memory.
        let registry = hostile_registry(vec![b' '; 64 << 10], true).await;
        let err = search_registry(&registry, "x").await.unwrap_err();
        assert!(err.contains("over 1048576 bytes"), "{err}");
        // Nesting far past serde_json's depth: an error, not a stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let registry = hostile_registry(deep.into_bytes(), false).await;
        let err = search_registry(&registry, "x").await.unwrap_err();
        assert!(err.contains("not a catalog"), "{err}");
        // Names that are not strings, or carry escapes, stay data.
        let odd = br#"{"repositories": [1, null, {"a": "b"}, "ok/x", "evil\u001b]0;x\u0007"]}"#;
        let registry = hostile_registry(odd.to_vec(), false).await;
        let found = search_registry(&registry, "").await.unwrap();
        let names: Vec<&str> = found.iter().map(|r| r.repository.as_str()).collect();
        assert_eq!(names, ["ok/x", "evil\u{1b}]0;x\u{7}"]);
    }
}
