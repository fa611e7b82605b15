//! `serve mcp --http ADDR`: the same server over MCP's Streamable HTTP
//! transport (rmcp's), for many clients at once, each in its own session.
//! Every request first passes the [`gate::Gate`]: its `Host` and `Origin`
//! must name this server (403 otherwise), then its bearer token must be
//! this server's (401). Without a token the server only listens on
//! loopback; off loopback it also needs TLS. Before that, [`limits`] bounds
//! what a connection may hold without authenticating.

pub mod gate;
pub mod limits;
mod loopback;
mod preview;
pub mod tls;
pub mod token;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, SessionConfig};
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::{TcpListener, TcpStream};

use crate::server::{MicroagentServer, PreviewBase};
use gate::{Gate, Refusal};
use limits::{Admission, Connections};

/// Where the MCP endpoint is served; other paths are 404.
pub const MCP_PATH: &str = "/mcp";
/// How long a session lives by default without a request from its
/// client or a call running (rmcp's keep-alive).
pub const DEFAULT_SESSION_TIMEOUT: Duration = SessionConfig::DEFAULT_KEEP_ALIVE;

/// How `serve mcp --http` serves.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The address to listen on (port 0: any free one).
    pub bind: SocketAddr,
    /// The bearer token clients must send; none serves loopback only.
    pub token: Option<String>,
    /// A PEM certificate chain and its key: HTTPS instead of HTTP.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Web origins (`scheme://host[:port]`) allowed besides the server's own.
    pub allowed_origins: Vec<String>,
    /// Connections open at once ([`limits::DEFAULT_MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// How long a session lives without a request from its client or a
    /// call running ([`DEFAULT_SESSION_TIMEOUT`]).
    pub session_timeout: Duration,
    /// Serve preview URLs only, no MCP endpoint (`serve preview`).
    pub previews_only: bool,
    /// The domain under which each preview has a host name, so an origin,
    /// of its own (`<label>.<domain>`: a wildcard name that reaches this
    /// server). Default on loopback: `localhost`, which browsers resolve
    /// to loopback themselves; elsewhere none, and previews are served
    /// only on the server's own origin, sandboxed.
    pub preview_domain: Option<String>,
}

/// Why the HTTP server could not run.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// No token was given for an address other machines can reach.
    #[error("serving {0} without a token: only loopback addresses may go without one")]
    NoTokenOffLoopback(SocketAddr),
    /// Plain HTTP was asked for on an address other machines can reach.
    #[error("serving {0} without TLS: the token would cross the network in clear text")]
    NoTlsOffLoopback(SocketAddr),
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The preview domain is not a host name.
    #[error("the preview domain {0:?} is not a DNS name (letters, digits, hyphens and dots)")]
    PreviewDomain(String),
    /// The address could not be listened on.
    #[error("listening on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

/// Whether `bind` may be served with or without a token and TLS: off
/// loopback it needs both. Front ends ask before they make a token, so a
/// start refused anyway leaves nothing behind.
pub fn check_exposure(bind: SocketAddr, token: bool, tls: bool) -> Result<(), HttpError> {
    if bind.ip().is_loopback() {
        Ok(())
    } else if !token {
        Err(HttpError::NoTokenOffLoopback(bind))
    } else if !tls {
        Err(HttpError::NoTlsOffLoopback(bind))
    } else {
        Ok(())
    }
}

/// A bound HTTP server, not yet serving.
pub struct HttpServer {
    listener: TcpListener,
    /// The same port on the other loopback address, when the server is on
    /// one (see [`loopback::twin_loopback`]).
    twin: Option<TcpListener>,
    local: SocketAddr,
    gate: Arc<Gate>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    server: MicroagentServer,
    connections: Arc<Connections>,
    previews_only: bool,
    serves_previews: bool,
    session_timeout: Duration,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer")
            .field("local", &self.local)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl HttpServer {
    /// Checks `options` and binds their address.
    pub async fn bind(server: MicroagentServer, options: HttpOptions) -> Result<Self, HttpError> {
        let bind = options.bind;
        // Previews alone need no bearer token: each URL's is its access.
        let guarded = options.token.is_some() || options.previews_only;
        check_exposure(bind, guarded, options.tls.is_some())?;
        let preview_domain = match &options.preview_domain {
            Some(domain) if gate::is_domain(domain) => Some(domain.to_ascii_lowercase()),
            Some(domain) => return Err(HttpError::PreviewDomain(domain.clone())),
            None => None,
        };
        let tls = match &options.tls {
            Some((cert, key)) => Some(tls::acceptor(cert, key)?),
            None => None,
        };
        let bind_error = |source| HttpError::Bind { addr: bind, source };
        let listener = TcpListener::bind(bind).await.map_err(bind_error)?;
        let local = listener.local_addr().map_err(bind_error)?;
        let twin = loopback::twin_loopback(local).await;
        // `localhost` names reach both loopback addresses, and clients
        // try ::1 first: previews get `pv<id>.localhost` only where this
        // server holds the port on both, so no other program answers them.
        let preview_domain = preview_domain.or_else(|| match &twin {
            loopback::Twin::Held(_) | loopback::Twin::NoSuchFamily => {
                loopback::own_loopback(local).then(|| "localhost".to_owned())
            }
            loopback::Twin::Taken(e) => {
                tracing::warn!(
                    "the other loopback address at port {} is taken ({e}): previews are served on this server's own origin only, sandboxed",
                    local.port()
                );
                None
            }
        });
        let gate = Arc::new(
            Gate::new(local, &options.allowed_origins, options.token)
                .with_preview_domain(preview_domain.clone()),
        );
        let scheme = if tls.is_some() { "https" } else { "http" };
        // A URL to hand out: an address that listens on every interface
        // is reached here on loopback.
        let reach = match local.ip() {
            ip if ip.is_unspecified() && ip.is_ipv4() => {
                SocketAddr::from(([127, 0, 0, 1], local.port()))
            }
            ip if ip.is_unspecified() => {
                SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, local.port()))
            }
            _ => local,
        };
        // A guest's pages share this server's origin: only the MCP token
        // (which they do not have) keeps them from driving `/mcp`, so a
        // server without one (`--dev`) serves no previews. Off loopback a
        // preview reaches a guest from other machines: the MCP server
        // serves them only with the grant a public port needs (`serve
        // preview`, run by a person, is that choice itself).
        let serves_previews = options.previews_only
            || (guarded && server.grants.check_port_address(local.ip()).is_ok());
        let server = if guarded {
            server.serving_previews_at(PreviewBase {
                scheme,
                reach,
                domain: preview_domain,
                ip: local.ip(),
            })
        } else {
            server
        };
        Ok(Self {
            listener,
            twin: match twin {
                loopback::Twin::Held(twin) => Some(twin),
                _ => None,
            },
            local,
            gate,
            tls,
            server,
            connections: Connections::new(options.max_connections),
            previews_only: options.previews_only,
            serves_previews,
            session_timeout: options.session_timeout,
        })
    }

    /// `scheme://pv<id>.<domain>:<port>`: the form of each preview's own
    /// origin, when they have one.
    pub fn preview_origins(&self) -> Option<String> {
        self.server.preview_base.as_ref()?.origin_form()
    }

    /// The endpoint clients connect to (the preview URLs' base when it
    /// serves previews only).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let path = if self.previews_only {
            workspace::previews::PREVIEW_PATH
        } else {
            MCP_PATH
        };
        format!("{scheme}://{}{path}", self.local)
    }

    /// Serves until `shutdown` completes, then ends every session and
    /// gives calls in flight [`crate::SHUTDOWN_GRACE`] to clean up.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let config = StreamableHttpServerConfig::default()
            // The gate checks Host and Origin before the token; rmcp's own
            // check would only repeat it.
            .disable_allowed_hosts()
            .disable_allowed_origins();
        let sessions_end = config.cancellation_token.clone();
        let base = self.server.clone();
        let keep_alive = self.session_timeout;
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(keep_alive);
        let service = StreamableHttpService::new(
            // One server per session: its session-scoped workspaces go
            // when rmcp drops it (closed, expired, or the server ends).
            move || Ok(base.for_new_http_session(keep_alive)),
            Arc::new(sessions),
            config,
        );
        tokio::pin!(shutdown);
        // Set while accepting fails, so a run of failures logs once.
        let mut failing = false;
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.listener.accept() => accepted,
                accepted = loopback::accept_on(self.twin.as_ref()) => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(e) if limits::one_connection_lost(&e) => continue,
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            "accepting a connection: {e}; retrying every {} ms",
                            limits::ACCEPT_RETRY.as_millis()
                        );
                        failing = true;
                    }
                    // Out of descriptors: give back those of connections
                    // that have not authenticated, so the queue moves.
                    if limits::out_of_resources(&e) {
                        let shed = self.connections.shed_unauthenticated();
                        tracing::debug!("closed {shed} unauthenticated connection(s)");
                    }
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(limits::ACCEPT_RETRY) => continue,
                    }
                }
            };
            if std::mem::take(&mut failing) {
                tracing::info!("accepting connections again");
            }
            let Some(admission) = self.connections.admit() else {
                tracing::debug!("every connection has authenticated; closed a new one");
                continue;
            };
            let (gate, service, tls) = (self.gate.clone(), service.clone(), self.tls.clone());
            let workspaces = self.server.workspaces().clone();
            let site = Site {
                gate,
                service,
                workspaces,
                previews_only: self.previews_only,
                serves_previews: self.serves_previews,
            };
            tokio::spawn(serve_connection(stream, tls, Arc::new(site), admission));
        }
        sessions_end.cancel();
        if !self
            .server
            .inflight()
            .wait_idle(crate::SHUTDOWN_GRACE)
            .await
        {
            tracing::warn!("tool calls still running at shutdown; leaving them");
        }
    }
}

/// What answers carry: rmcp's bodies and a preview's guest's, whose
/// reading may fail.
type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;
type Service = StreamableHttpService<MicroagentServer, LocalSessionManager>;

/// One connection: the TLS handshake and each request's header within
/// their bounds, until the client or the server ends it, or the server
/// closes it to make room.
async fn serve_connection(
    stream: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    site: Arc<Site>,
    admission: Admission,
) {
    let authenticated = admission.authenticated();
    let handler = hyper::service::service_fn(move |req| {
        let (site, authenticated) = (site.clone(), authenticated.clone());
        async move { Ok::<_, Infallible>(route(&site, &authenticated, req).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits::HEADER_READ_TIMEOUT);
    let serve = async {
        let served = match tls {
            Some(tls) => {
                match tokio::time::timeout(limits::TLS_HANDSHAKE_TIMEOUT, tls.accept(stream)).await
                {
                    Ok(Ok(stream)) => {
                        builder
                            .serve_connection(TokioIo::new(stream), handler)
                            .with_upgrades()
                            .await
                    }
                    Ok(Err(e)) => {
                        tracing::debug!("TLS handshake: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("TLS handshake not done in time");
                        return;
                    }
                }
            }
            None => {
                builder
                    .serve_connection(TokioIo::new(stream), handler)
                    .with_upgrades()
                    .await
            }
        };
        if let Err(e) = served {
            tracing::debug!("HTTP connection: {e}");
        }
    };
    let closed = admission.closed();
    tokio::select! {
        () = serve => {}
        () = closed.cancelled() => {
            tracing::debug!("closed a connection that had not authenticated, to make room");
        }
    }
    drop(admission);
}

/// What every request of a server reaches.
struct Site {
    gate: Arc<Gate>,
    service: Service,
    workspaces: workspace::Workspaces,
    previews_only: bool,
    /// Off loopback without the public-ports grant: no previews.
    serves_previews: bool,
}

/// One request: the gate, the path, then the MCP service or a preview. A
/// request past the token check marks its connection `authenticated`.
async fn route(site: &Site, authenticated: &AtomicBool, req: Request<Incoming>) -> Response<Body> {
    let (gate, service) = (&site.gate, &site.service);
    // What names the server is one `Host`, not contradicted by the target
    // (an absolute-form request's authority), so no check reads another.
    let hosts = req.headers().get_all(hyper::header::HOST).iter().count();
    let host = req.headers().get(hyper::header::HOST);
    let contradicted = req.uri().authority().is_some_and(|a| {
        host.is_none_or(|h| !h.as_bytes().eq_ignore_ascii_case(a.as_str().as_bytes()))
    });
    if hosts > 1 || contradicted {
        return plain(
            400,
            "one Host header, naming what the request's target names\n".into(),
        );
    }
    // A preview's token is its own capability. On its own origin
    // (`<label>.<domain>`) a request reaches that preview alone; on the
    // server's origin its pages are sandboxed, and `/mcp` needs the MCP
    // token either way.
    if site.serves_previews {
        if let Some(label) = gate.preview_host(req.headers()) {
            if let Err(refusal) = gate.check_preview_origin(req.headers(), &label) {
                tracing::info!("refused a preview request: {refusal}");
                return refused(&refusal);
            }
            return preview::serve(&site.workspaces, req, Some(&label)).await;
        }
        if preview::is_preview(req.uri().path()) {
            if let Err(refusal) = gate.check_preview_site(req.headers()) {
                tracing::info!("refused a preview request: {refusal}");
                return refused(&refusal);
            }
            return preview::serve(&site.workspaces, req, None).await;
        }
    }
    if site.previews_only {
        return plain(
            404,
            "not found: this server serves preview URLs only (/preview/<token>/)\n".into(),
        );
    }
    if let Err(refusal) = gate.check(req.headers()) {
        tracing::info!("refused a request: {refusal}");
        return refused(&refusal);
    }
    authenticated.store(true, Ordering::Relaxed);
    if req.uri().path() != MCP_PATH {
        return plain(404, format!("not found: the MCP endpoint is {MCP_PATH}\n"));
    }
    let ends_session = req.method() == hyper::Method::DELETE;
    let mut response = service
        .handle(req)
        .await
        .map(|body| body.map_err(|never| match never {}).boxed());
    // rmcp answers a session's end with 202; the Python SDK (the reference
    // client) takes only 200 or 204 as done.
    if ends_session && response.status() == hyper::StatusCode::ACCEPTED {
        *response.status_mut() = hyper::StatusCode::NO_CONTENT;
    }
    response
}

fn refused(refusal: &Refusal) -> Response<Body> {
    let mut response = plain(refusal.status(), format!("{refusal}\n"));
    if refusal.status() == 401 {
        response.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

fn plain(status: u16, text: String) -> Response<Body> {
    let body = Full::new(Bytes::from(text)).map_err(|never| match never {});
    let mut response = Response::new(body.boxed());
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
