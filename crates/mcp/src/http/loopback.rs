//! The server's port on both loopback addresses: a client of a
//! `localhost` name (`localhost:PORT`, a preview's `pv<id>.localhost:PORT`)
//! tries `::1` and `127.0.0.1`, `::1` first, and a program listening on
//! the one the server does not hold would get its requests, tokens and
//! all (a guest port published on `[::1]:PORT`, for one).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::net::TcpListener;

/// The other loopback address at the server's port.
pub(super) enum Twin {
    /// Bound by this server.
    Held(TcpListener),
    /// The host has no such address (no IPv6): nothing can listen there.
    NoSuchFamily,
    /// Another program listens there (or it could not be bound).
    Taken(std::io::Error),
}

/// Whether `local` is `127.0.0.1` or `::1`, the addresses `localhost`
/// names resolve to.
pub(super) fn own_loopback(local: SocketAddr) -> bool {
    local.ip() == IpAddr::V4(Ipv4Addr::LOCALHOST) || local.ip() == IpAddr::V6(Ipv6Addr::LOCALHOST)
}

/// Binds the same port on the other loopback address than `local`'s
/// (`::1` beside `127.0.0.1`, and the reverse).
pub(super) async fn twin_loopback(local: SocketAddr) -> Twin {
    if !own_loopback(local) {
        return Twin::NoSuchFamily;
    }
    let other: IpAddr = match local.ip() {
        IpAddr::V4(_) => Ipv6Addr::LOCALHOST.into(),
        IpAddr::V6(_) => Ipv4Addr::LOCALHOST.into(),
    };
    match TcpListener::bind((other, local.port())).await {
        Ok(twin) => Twin::Held(twin),
        Err(e)
            if e.kind() == std::io::ErrorKind::AddrNotAvailable
                || e.raw_os_error() == Some(libc::EAFNOSUPPORT) =>
        {
            Twin::NoSuchFamily
        }
        Err(e) => Twin::Taken(e),
    }
}

/// The next connection on `twin`; never, without one.
pub(super) async fn accept_on(
    twin: Option<&TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    match twin {
        Some(twin) => twin.accept().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_other_loopback_address_is_held_or_said_taken() {
        let v4 = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let local = v4.local_addr().unwrap();
        match twin_loopback(local).await {
            Twin::Held(twin) => {
                assert_eq!(twin.local_addr().unwrap().port(), local.port());
                assert!(twin.local_addr().unwrap().ip().is_loopback());
                // Held: another program cannot listen there any more.
                let other = TcpListener::bind(twin.local_addr().unwrap()).await;
                assert!(other.is_err());
            }
            Twin::NoSuchFamily => eprintln!("skipped: this host has no ::1"),
            Twin::Taken(e) => panic!("a free port's twin was taken: {e}"),
        }
        // Another program on ::1 first: the server learns it is taken.
        let Ok(squatter) = TcpListener::bind("[::1]:0").await else {
            eprintln!("skipped: this host has no ::1");
            return;
        };
        let port = squatter.local_addr().unwrap().port();
        let Ok(v4) = TcpListener::bind(("127.0.0.1", port)).await else {
            eprintln!("skipped: 127.0.0.1:{port} is in use");
            return;
        };
        assert!(matches!(
            twin_loopback(v4.local_addr().unwrap()).await,
            Twin::Taken(_)
        ));
        // Off the loopback names, nothing to hold.
        assert!(!own_loopback("127.0.0.2:80".parse().unwrap()));
        assert!(own_loopback("[::1]:80".parse().unwrap()));
    }
}
