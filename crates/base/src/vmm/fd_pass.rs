//! One descriptor passed beside bytes over a Unix stream (`SCM_RIGHTS`):
//! the library binds a published port's listening socket and hands it to
//! the VMM, which then never opens an internet socket itself.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Control-message room for one descriptor, aligned as `cmsghdr` needs.
#[repr(C, align(8))]
struct OneFdSpace([u8; 32]);

fn space_for_one() -> usize {
    // SAFETY: CMSG_SPACE only computes a size.
    unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize }
}

/// Sends `bytes` with `fd` attached to the first of them.
pub fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut control = OneFdSpace([0; 32]);
    let space = space_for_one();
    debug_assert!(space <= control.0.len());
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: msg_control points at `space` bytes of aligned room, enough
    // for one header and one descriptor; CMSG_FIRSTHDR is then non-null.
    let sent = unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_SOCKET;
        (*header).cmsg_type = libc::SCM_RIGHTS;
        (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), fd.as_raw_fd());
        libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    // The descriptor went with the first byte; the rest is plain.
    io::Write::write_all(&mut &*stream, &bytes[sent as usize..])
}

/// Reads into `buf` as `read` would, and takes the descriptor attached to
/// those bytes, if any (close-on-exec; extra ones are closed).
pub fn recv_with_fd(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut control = OneFdSpace([0; 32]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len();
    // SAFETY: msg points at live buffers of the lengths it gives.
    let got = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut taken: Option<OwnedFd> = None;
    // SAFETY: the kernel filled msg_control with msg_controllen bytes of
    // well-formed headers; each SCM_RIGHTS payload is descriptors now ours.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&msg);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header);
                let len = (*header).cmsg_len - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    let owned = OwnedFd::from_raw_fd(fd);
                    if taken.is_none() {
                        taken = Some(owned);
                    }
                }
            }
            header = libc::CMSG_NXTHDR(&msg, header);
        }
    }
    Ok((got as usize, taken))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_travels_with_the_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        send_with_fd(&a, b"hello\n", listener.as_fd()).unwrap();
        drop(listener);
        let mut buf = [0u8; 64];
        let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello\n");
        let received = std::net::TcpListener::from(fd.expect("the descriptor"));
        assert_eq!(received.local_addr().unwrap().port(), port);
        // Plain bytes carry none.
        io::Write::write_all(&mut &a, b"x").unwrap();
        let (n, fd) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!((n, fd.is_none()), (1, true));
    }
}
