//! The proxy between a client and a guest's server, both played by hyper
//! on loopback: what the guest's server receives, what comes back, and an
//! upgraded connection joined end to end.

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::headers::Rewrite;
use super::*;
use hyper::header::{self, HeaderMap, HeaderValue};

/// Serves each connection to a new loopback listener with `handle`; its
/// address.
async fn listen<H, F, B>(handle: H) -> SocketAddr
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let handle = handle.clone();
            let service = hyper::service::service_fn(move |req| {
                let answer = handle(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

/// The guest's server: `/ws` upgrades to an echo, anything else answers
/// with what it received, sets two cookies, and says things a guest must
/// not get through.
async fn guest_server() -> SocketAddr {
    listen(|mut req: Request<Incoming>| async move {
        if req.uri().path() == "/ws" {
            let upgraded = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                let mut io = TokioIo::new(upgraded.await.unwrap());
                let mut buf = [0u8; 64];
                loop {
                    let n = io.read(&mut buf).await.unwrap_or(0);
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            return Response::builder()
                .status(101)
                .header("connection", "upgrade")
                .header("upgrade", "echo")
                .body(Full::new(Bytes::new()))
                .unwrap();
        }
        let h = |name: &str| {
            req.headers()
                .get(name)
                .map_or("-".to_owned(), |v| v.to_str().unwrap().to_owned())
        };
        let text = format!(
            "{} host={} auth={} prefix={} fhost={} te={} cookie={} xff={} origin={}",
            req.uri(),
            h("host"),
            h("authorization"),
            h("x-forwarded-prefix"),
            h("x-forwarded-host"),
            h("x-private"),
            h("cookie"),
            h("x-forwarded-for"),
            h("origin")
        );
        Response::builder()
            .header("set-cookie", "a=1; Path=/; Domain=example.com; HttpOnly")
            .header("set-cookie", "b=2")
            .header("service-worker-allowed", "/")
            .header("clear-site-data", "\"*\"")
            .header("location", "/login")
            .body(Full::new(Bytes::from(text)))
            .unwrap()
    })
    .await
}

/// The proxy in front of `guest`, as if `/preview/T` opened port 8080.
async fn proxy(guest: SocketAddr) -> SocketAddr {
    listen(move |req: Request<Incoming>| async move {
        let path = req
            .uri()
            .path_and_query()
            .unwrap()
            .as_str()
            .strip_prefix("/preview/T")
            .unwrap()
            .to_owned();
        let to_guest = TcpStream::connect(guest).await.unwrap();
        let rewrite = Rewrite {
            prefix: "/preview/T",
            port: 8080,
            cookie_prefix: "pvX_",
            own_origin: false,
        };
        forward(req, &path, &rewrite, to_guest, || true).await
    })
    .await
}

#[tokio::test]
async fn a_request_reaches_the_guest_as_its_own_and_its_answer_comes_back_held() {
    let front = proxy(guest_server().await).await;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(
        TcpStream::connect(front).await.unwrap(),
    ))
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = Request::builder()
        .uri("/preview/T/app/page?q=1")
        .header("host", format!("{front}"))
        .header("authorization", "Bearer the-mcp-token")
        .header("connection", "x-private")
        .header("x-private", "hop")
        .header("cookie", "other=1; pvX_a=2")
        .header("x-forwarded-for", "6.6.6.6")
        .header("origin", format!("http://{front}"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let answer = sender.send_request(req).await.unwrap();
    assert_eq!(answer.status(), 200);
    let cookies: Vec<String> = answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        cookies,
        [
            "pvX_a=1; HttpOnly; Path=/preview/T/",
            "pvX_b=2; Path=/preview/T/"
        ]
    );
    assert_eq!(answer.headers()["referrer-policy"], "no-referrer");
    assert_eq!(answer.headers()["location"], "/preview/T/login");
    for origin_wide in ["service-worker-allowed", "clear-site-data"] {
        assert!(!answer.headers().contains_key(origin_wide), "{origin_wide}");
    }
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&body),
        format!(
            "/app/page?q=1 host=localhost:8080 auth=- prefix=/preview/T fhost={front} te=- cookie=a=2 xff=- origin=http://localhost:8080"
        )
    );
}

#[tokio::test]
async fn an_upgrade_joins_the_client_and_the_guest() {
    let front = proxy(guest_server().await).await;
    let mut stream = TcpStream::connect(front).await.unwrap();
    stream
        .write_all(
            b"GET /preview/T/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    stream.write_all(b"ping through").await.unwrap();
    let mut echoed = [0u8; 12];
    stream.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping through");
}

#[test]
fn cookies_are_held_to_the_preview_whatever_path_they_name() {
    let mut headers = HeaderMap::new();
    for c in [
        "s=1; path=/x; domain=.evil; Secure",
        "t=2; Path=rel",
        "odd",
        "u=3; Path=/../../",
        "v=4; Path=/%2E%2E/",
    ] {
        headers.append(header::SET_COOKIE, HeaderValue::from_static(c));
    }
    headers.insert(
        header::LOCATION,
        HeaderValue::from_static("http://localhost:8080/a"),
    );
    let rewrite = Rewrite {
        prefix: "/preview/T",
        port: 8080,
        cookie_prefix: "pvX_",
        own_origin: false,
    };
    rewrite.answer(&mut headers);
    let held: Vec<&str> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(
        held,
        [
            "pvX_s=1; Secure; Path=/preview/T/x",
            "pvX_t=2; Path=/preview/T/rel",
            "pvX_odd; Path=/preview/T/"
        ]
    );
    assert_eq!(headers[header::LOCATION], "/preview/T/a");
    // Elsewhere is left alone.
    let mut away = HeaderMap::new();
    away.insert(
        header::LOCATION,
        HeaderValue::from_static("//evil.example/x"),
    );
    rewrite.answer(&mut away);
    assert_eq!(away[header::LOCATION], "//evil.example/x");
    assert!(is_preview("/preview/abc/") && is_preview("/preview"));
    assert!(!is_preview("/previewx") && !is_preview("/mcp"));
}

#[test]
fn an_own_origin_serves_its_token_alone_and_the_shared_one_sandboxes() {
    let token = "a".repeat(64);
    let label = origin_label(&token).unwrap();
    assert!(served_here(Some(&label), &token));
    assert!(served_here(None, &token));
    let other = origin_label(&"b".repeat(64)).unwrap();
    assert!(!served_here(Some(&other), &token));
    assert!(!served_here(Some(&label), "not a token"));
    // A guest's own sandbox that would keep its origin is not the last
    // word: ours comes after it.
    let mut headers = HeaderMap::new();
    headers.append(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox allow-same-origin allow-scripts"),
    );
    sandbox(&mut headers);
    let policies: Vec<&str> = headers
        .get_all(header::CONTENT_SECURITY_POLICY)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert_eq!(policies.len(), 2);
    assert_eq!(policies.last(), Some(&SANDBOX));
    assert!(!SANDBOX.contains("allow-same-origin"));
}

#[test]
fn referrers_stay_within_a_previews_own_origin() {
    let mut shared = HeaderMap::new();
    let mut rewrite = Rewrite {
        prefix: "/preview/T",
        port: 8080,
        cookie_prefix: "cX_",
        own_origin: false,
    };
    shared.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("unsafe-url"),
    );
    rewrite.answer(&mut shared);
    assert_eq!(shared[header::REFERRER_POLICY], "no-referrer");
    assert!(!shared.contains_key("origin-agent-cluster"));
    let mut own = HeaderMap::new();
    own.insert("origin-agent-cluster", HeaderValue::from_static("?0"));
    rewrite.own_origin = true;
    rewrite.answer(&mut own);
    assert_eq!(own[header::REFERRER_POLICY], "same-origin");
    assert_eq!(own["origin-agent-cluster"], "?1");
}
