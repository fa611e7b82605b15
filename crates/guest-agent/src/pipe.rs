//! A byte pipe between a stream socket (vsock, or the VMM's hybrid vsock
//! Unix socket) and a TCP connection or another Unix socket, both ways:
//! the agent's end of a `tcp_connect` or a `forward`, and the VMM
//! process's end of a published port or of a service's relay.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;

/// Stack of the thread that copies one direction.
const PIPE_STACK: usize = 64 << 10;

/// A connected stream socket a pipe can carry: cloned for the second
/// direction, and half-closed when its direction ends.
pub trait PipeEnd: Send + Sized + 'static
where
    for<'a> &'a Self: Read + Write,
{
    /// A second handle on the same socket.
    fn try_clone(&self) -> io::Result<Self>;
    /// Ends what is written to it.
    fn shutdown_write(&self) -> io::Result<()>;
}

impl PipeEnd for TcpStream {
    fn try_clone(&self) -> io::Result<Self> {
        TcpStream::try_clone(self)
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

impl PipeEnd for UnixStream {
    fn try_clone(&self) -> io::Result<Self> {
        UnixStream::try_clone(self)
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}

/// Copies `stream` to `other` on a second thread and `other` to `stream`
/// on this one, until both directions have ended; each ends with a
/// half-close of its destination. A pipe may sit idle as long as its ends
/// keep it: no timeouts.
pub fn pipe<T: PipeEnd>(stream: UnixStream, other: T) -> io::Result<()>
where
    for<'a> &'a T: Read + Write,
{
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    let stream_in = stream.try_clone()?;
    let other_out = other.try_clone()?;
    let upstream = std::thread::Builder::new()
        .name("pipe".into())
        .stack_size(PIPE_STACK)
        .spawn(move || {
            // Either end may already be gone: then this direction is over.
            let _ = io::copy(&mut &stream_in, &mut &other_out);
            let _ = other_out.shutdown_write();
        })?;
    let _ = io::copy(&mut &other, &mut &stream);
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
