//! A byte pipe between a stream socket (vsock, or the VMM's hybrid vsock
//! Unix socket) and a TCP connection, both ways: the agent's end of a
//! `tcp_connect` and the VMM process's end of a published port.

use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;

/// Stack of the thread that copies one direction.
const PIPE_STACK: usize = 64 << 10;

/// Copies `stream` to `tcp` on a second thread and `tcp` to `stream` on
/// this one, until both directions have ended; each ends with a half-close
/// of its destination. A pipe may sit idle as long as its ends keep it: no
/// timeouts.
pub fn pipe(stream: UnixStream, tcp: TcpStream) -> io::Result<()> {
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    let stream_in = stream.try_clone()?;
    let tcp_out = tcp.try_clone()?;
    let upstream = std::thread::Builder::new()
        .name("pipe".into())
        .stack_size(PIPE_STACK)
        .spawn(move || {
            // Either end may already be gone: then this direction is over.
            let _ = io::copy(&mut &stream_in, &mut &tcp_out);
            let _ = tcp_out.shutdown(Shutdown::Write);
        })?;
    let _ = io::copy(&mut &tcp, &mut &stream);
    let _ = stream.shutdown(Shutdown::Write);
    let _ = upstream.join();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    #[test]
    fn bytes_cross_both_ways_and_ends_propagate() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let echo = std::thread::spawn(move || {
            let (mut c, _) = server.accept().unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).unwrap();
            got.reverse();
            c.write_all(&got).unwrap();
        });
        let (near, far) = UnixStream::pair().unwrap();
        let tcp = TcpStream::connect(addr).unwrap();
        let piped = std::thread::spawn(move || pipe(far, tcp).unwrap());
        (&near).write_all(b"hello pipe").unwrap();
        near.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        (&near).read_to_end(&mut back).unwrap();
        assert_eq!(back, b"epip olleh");
        echo.join().unwrap();
        piped.join().unwrap();
    }
}
