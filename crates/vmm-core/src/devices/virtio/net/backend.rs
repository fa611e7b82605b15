//! Where a virtio-net device's frames go on the host: a TAP interface, or a
//! stream socket speaking the length-prefixed frame protocol of `passt`
//! (and of QEMU's `-netdev stream`). Both are non-blocking and bounded: a
//! backend that cannot take a frame says so, and the device leaves the
//! guest's buffers on its queue until the backend's fd is writable again.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;

/// The largest Ethernet frame (without the virtio header) either way: a
/// 64 KiB IP packet and its Ethernet header, what `passt` sends at most.
pub const MAX_FRAME: usize = 65_550;
/// Output a stream backend holds while its socket is full.
const STREAM_TX_LIMIT: usize = 4 * (MAX_FRAME + 4);
/// Bytes of a stream frame's length prefix (big-endian u32).
const STREAM_PREFIX: usize = 4;

/// A host end for Ethernet frames.
pub trait NetBackend: Send {
    /// The fd to watch: readable when a frame may be waiting, writable
    /// when held output may drain.
    fn fd(&self) -> RawFd;
    /// Sends one frame, or holds it to send later;
    /// [`io::ErrorKind::WouldBlock`] when there is no room for it now
    /// (nothing was taken: try again once [`NetBackend::fd`] is writable).
    fn send(&mut self, frame: &[u8]) -> io::Result<()>;
    /// Pushes held output; `Ok(true)` when none is left.
    fn flush(&mut self) -> io::Result<bool>;
    /// Receives the next frame into `buf` (at least [`MAX_FRAME`] bytes);
    /// `Ok(None)` when none is ready. An error means the backend is gone.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;
    /// Whether [`NetBackend::recv`] has a frame ready that no fd event
    /// will announce (one a filter made in answer to a sent frame).
    fn has_queued(&self) -> bool {
        false
    }
}

/// `passt` (or any peer of its protocol) over a connected stream socket:
/// each frame is a big-endian u32 length and the Ethernet frame.
#[derive(Debug)]
pub struct StreamBackend {
    sock: UnixStream,
    /// Bytes read but not yet returned as frames.
    rx: Vec<u8>,
    /// Framed output the socket has not taken yet.
    tx: Vec<u8>,
}

impl StreamBackend {
    /// Uses `sock` (made non-blocking here).
    pub fn new(sock: UnixStream) -> io::Result<Self> {
        sock.set_nonblocking(true)?;
        Ok(Self {
            sock,
            rx: Vec::with_capacity(2 * (MAX_FRAME + STREAM_PREFIX)),
            tx: Vec::with_capacity(STREAM_TX_LIMIT),
        })
    }

    /// A whole frame at the start of `rx`: its length, once checked.
    fn buffered_frame(&self) -> io::Result<Option<usize>> {
        let Some(prefix) = self.rx.get(..STREAM_PREFIX) else {
            return Ok(None);
        };
        let mut len = [0u8; STREAM_PREFIX];
        len.copy_from_slice(prefix);
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the peer sent a {len}-byte frame (at most {MAX_FRAME})"),
            ));
        }
        Ok((self.rx.len() >= STREAM_PREFIX + len).then_some(len))
    }
}

impl NetBackend for StreamBackend {
    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let framed = STREAM_PREFIX + frame.len();
        if frame.len() > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "frame larger than the backend's maximum",
            ));
        }
        if self.tx.len() + framed > STREAM_TX_LIMIT {
            self.flush()?;
            if self.tx.len() + framed > STREAM_TX_LIMIT {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        // MAX_FRAME fits a u32.
        self.tx
            .extend_from_slice(&(frame.len() as u32).to_be_bytes());
        self.tx.extend_from_slice(frame);
        self.flush().map(drop)
    }

    fn flush(&mut self) -> io::Result<bool> {
        let mut sent = 0;
        while sent < self.tx.len() {
            match self.sock.write(&self.tx[sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.tx.drain(..sent);
        Ok(self.tx.is_empty())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            if let Some(len) = self.buffered_frame()? {
                let Some(out) = buf.get_mut(..len) else {
                    return Err(io::ErrorKind::InvalidInput.into());
                };
                out.copy_from_slice(&self.rx[STREAM_PREFIX..STREAM_PREFIX + len]);
                self.rx.drain(..STREAM_PREFIX + len);
                return Ok(Some(len));
            }
            // Never more than one frame's worth past what is buffered.
            let mut chunk = [0u8; 16 << 10];
            match self.sock.read(&mut chunk) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => self.rx.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Bytes of the virtio-net header a TAP with IFF_VNET_HDR carries
/// (`struct virtio_net_hdr_v1`).
pub const VNET_HDR_LEN: usize = 12;

/// A TAP interface opened with IFF_VNET_HDR: each frame on the fd carries
/// a virtio-net header (all zero here: no offload is negotiated).
#[derive(Debug)]
pub struct TapBackend {
    file: std::fs::File,
    name: String,
}

impl TapBackend {
    /// Opens (and, with CAP_NET_ADMIN, creates) the TAP interface `name`.
    pub fn open(name: &str) -> io::Result<Self> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TAP name `{name}` must have 1 to 15 bytes"),
            ));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        // SAFETY: ifreq is plain data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as i16;
        // SAFETY: TUNSETIFF reads and writes the ifreq we own; the fd is ours.
        if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let hdr_len = VNET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int we own.
        if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr_len) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            file,
            name: name.to_owned(),
        })
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl NetBackend for TapBackend {
    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let hdr = [0u8; VNET_HDR_LEN];
        loop {
            match (&self.file).write_vectored(&[IoSlice::new(&hdr), IoSlice::new(frame)]) {
                // A TAP takes a frame whole or not at all.
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn flush(&mut self) -> io::Result<bool> {
        Ok(true)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let mut hdr = [0u8; VNET_HDR_LEN];
        loop {
            let mut bufs = [IoSliceMut::new(&mut hdr), IoSliceMut::new(buf)];
            match (&self.file).read_vectored(&mut bufs) {
                Ok(n) => return Ok(Some(n.saturating_sub(VNET_HDR_LEN))),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (StreamBackend, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        (StreamBackend::new(a).unwrap(), b)
    }

    #[test]
    fn frames_are_length_prefixed_big_endian() {
        let (mut be, mut peer) = pair();
        be.send(b"hello").unwrap();
        let mut got = [0u8; 9];
        peer.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"\0\0\0\x05hello");
    }

    #[test]
    fn receives_frames_split_and_joined_across_reads() {
        let (mut be, mut peer) = pair();
        let mut buf = vec![0u8; MAX_FRAME];
        assert_eq!(be.recv(&mut buf).unwrap(), None);
        peer.write_all(b"\0\0\0\x03ab").unwrap();
        assert_eq!(be.recv(&mut buf).unwrap(), None, "half a frame");
        peer.write_all(b"c\0\0\0\x02xy").unwrap();
        assert_eq!(be.recv(&mut buf).unwrap(), Some(3));
        assert_eq!(&buf[..3], b"abc");
        assert_eq!(be.recv(&mut buf).unwrap(), Some(2));
        assert_eq!(&buf[..2], b"xy");
        assert_eq!(be.recv(&mut buf).unwrap(), None);
    }

    #[test]
    fn an_oversized_frame_or_a_closed_peer_is_an_error() {
        let (mut be, mut peer) = pair();
        let mut buf = vec![0u8; MAX_FRAME];
        peer.write_all(&((MAX_FRAME as u32) + 1).to_be_bytes())
            .unwrap();
        assert_eq!(
            be.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        let (mut be, peer) = pair();
        drop(peer);
        assert_eq!(
            be.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn a_full_socket_holds_output_up_to_a_bound_then_refuses() {
        let (mut be, mut peer) = pair();
        let frame = vec![7u8; MAX_FRAME];
        let mut taken = 0;
        loop {
            match be.send(&frame) {
                Ok(()) => taken += 1,
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
                    break;
                }
            }
            assert!(taken < 1000, "never refused");
        }
        assert!(!be.flush().unwrap(), "output is held");
        // The peer drains everything: every taken frame arrives whole.
        peer.set_nonblocking(false).unwrap();
        let reader = std::thread::spawn(move || {
            let mut frames = 0;
            let mut prefix = [0u8; 4];
            let mut body = vec![0u8; MAX_FRAME];
            while peer.read_exact(&mut prefix).is_ok() {
                assert_eq!(u32::from_be_bytes(prefix) as usize, MAX_FRAME);
                peer.read_exact(&mut body).unwrap();
                assert!(body.iter().all(|&b| b == 7));
                frames += 1;
            }
            frames
        });
        while !be.flush().unwrap() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(be);
        assert_eq!(reader.join().unwrap(), taken);
    }
}
