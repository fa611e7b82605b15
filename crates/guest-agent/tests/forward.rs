//! `forward`: the agent (a host process on a Unix socket, so its "host"
//! is `<socket>_<vsock_port>`) listens on 127.0.1.x and carries each
//! connection to the host's port; the set is replaced whole.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixListener;
use std::time::Duration;

use common::{exchange, hello_bytes, responses, Agent};
use guest_agent::frame;
use guest_agent::protocol::{
    AgentErrorCode, Forward, Request, Response, MAX_FORWARD_CONNECTIONS, PROTOCOL_VERSION,
};

fn set(agent: &Agent, forwards: &[Forward]) -> Response {
    let mut bytes = hello_bytes(PROTOCOL_VERSION);
    bytes.extend(
        frame::encode_json(&Request::Forward {
            forwards: forwards.to_vec(),
        })
        .unwrap(),
    );
    let got = responses(&exchange(agent, &bytes));
    assert_eq!(got.len(), 2, "{got:?}");
    got[1].clone()
}

/// A port free on `addr` now.
fn free_port(addr: Ipv4Addr) -> u16 {
    TcpListener::bind(SocketAddr::from((addr, 0)))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn forward(name: &str, last: u8, port: u16, vsock_port: u32) -> Forward {
    Forward {
        name: name.into(),
        addr: Ipv4Addr::new(127, 0, 1, last),
        port,
        vsock_port,
    }
}

/// The host's side of vsock port `port`, as a VMM names it.
fn host_side(agent: &Agent, port: u32) -> UnixListener {
    let mut path = agent.socket.clone().into_os_string();
    path.push(format!("_{port}"));
    UnixListener::bind(path).unwrap()
}

fn connect(f: &Forward) -> std::io::Result<TcpStream> {
    let s =
        TcpStream::connect_timeout(&SocketAddr::from((f.addr, f.port)), Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// A byte each way through the forward.
fn round_trip(f: &Forward, host: &UnixListener) {
    let mut guest = connect(f).unwrap();
    guest.write_all(b"ping").unwrap();
    let (mut there, _) = host.accept().unwrap();
    let mut got = [0u8; 4];
    there.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    there.write_all(b"pong").unwrap();
    guest.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"pong");
}

#[test]
fn a_forward_carries_connections_to_the_hosts_port_and_the_set_is_replaced_whole() {
    let agent = Agent::start();
    let db = forward("db", 7, free_port(Ipv4Addr::new(127, 0, 1, 7)), 7001);
    let web = forward("web", 8, free_port(Ipv4Addr::new(127, 0, 1, 8)), 7002);
    let db_host = host_side(&agent, db.vsock_port);
    let web_host = host_side(&agent, web.vsock_port);

    assert_eq!(set(&agent, std::slice::from_ref(&db)), Response::ok());
    round_trip(&db, &db_host);
    // The same set again changes nothing; a connection made before lives on.
    let mut kept = connect(&db).unwrap();
    let (mut kept_there, _) = db_host.accept().unwrap();
    assert_eq!(set(&agent, &[db.clone(), web.clone()]), Response::ok());
    round_trip(&web, &web_host);
    round_trip(&db, &db_host);

    // A set the rules refuse leaves the one before.
    let refused = set(&agent, &[forward("Bad", 9, 1, 1)]);
    assert!(
        matches!(
            &refused,
            Response::Error {
                code: AgentErrorCode::InvalidInput,
                ..
            }
        ),
        "{refused:?}"
    );
    round_trip(&web, &web_host);

    // Without db: its port is closed, its open connection is not.
    assert_eq!(set(&agent, std::slice::from_ref(&web)), Response::ok());
    common::eventually("db's listener to close", || connect(&db).is_err());
    kept.write_all(b"still").unwrap();
    let mut got = [0u8; 5];
    kept_there.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still");
    round_trip(&web, &web_host);

    // Re-pointed in place: the same address and port now go to another
    // host port, without a second bind.
    let moved_host = host_side(&agent, 7005);
    let mut moved = web.clone();
    moved.vsock_port = 7005;
    assert_eq!(set(&agent, std::slice::from_ref(&moved)), Response::ok());
    round_trip(&moved, &moved_host);

    // None: nothing listens.
    assert_eq!(set(&agent, &[]), Response::ok());
    common::eventually("web's listener to close", || connect(&web).is_err());
    common::ping(&agent);
}

#[test]
fn a_connection_with_nothing_on_the_host_ends_and_past_the_cap_is_closed() {
    let agent = Agent::start();
    let lonely = forward("lonely", 9, free_port(Ipv4Addr::new(127, 0, 1, 9)), 7003);
    let busy = forward("busy", 10, free_port(Ipv4Addr::new(127, 0, 1, 10)), 7004);
    let busy_host = host_side(&agent, busy.vsock_port);
    assert_eq!(set(&agent, &[lonely.clone(), busy.clone()]), Response::ok());

    // No host listener: the guest's connection ends, it does not hang.
    let mut s = connect(&lonely).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(s.read(&mut buf).unwrap_or(0), 0);

    // The cap: connections held open on the host, one more is closed.
    let mut held = Vec::new();
    for _ in 0..MAX_FORWARD_CONNECTIONS {
        let guest = connect(&busy).unwrap();
        let (there, _) = busy_host.accept().unwrap();
        held.push((guest, there));
    }
    let mut over = connect(&busy).unwrap();
    assert_eq!(over.read(&mut buf).unwrap_or(0), 0, "past the cap");
    // One ends: room again.
    drop(held.pop());
    common::eventually("a slot to free", || {
        let Ok(_guest) = connect(&busy) else {
            return false;
        };
        busy_host.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let took = loop {
            match busy_host.accept() {
                Ok(_) => break true,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(_) => break false,
            }
        };
        busy_host.set_nonblocking(false).unwrap();
        took
    });
}
