//! A layer's bytes read on a thread of their own: inflated (gzip, zstd
//! or plain) and hashed, at most the budget's bytes, handed to the
//! unpacking in chunks, so inflating and hashing run beside its file
//! writes.

use std::io::{self, Read};
use std::sync::mpsc::{Receiver, SyncSender};

use sha2::{Digest, Sha256};

use super::OciError;

/// Chunks the thread that inflates and hashes a layer may read ahead of
/// its unpacking, and their size (2 MiB in flight at most).
pub(super) const READ_AHEAD_CHUNKS: usize = 8;
const READ_AHEAD_CHUNK: usize = 256 << 10;

/// The bytes another thread reads, as a reader: what it sent, then the end
/// when it stops (its own error, if any, is taken from the thread).
pub(super) struct Handed {
    from: Receiver<io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
}

impl From<Receiver<io::Result<Vec<u8>>>> for Handed {
    fn from(from: Receiver<io::Result<Vec<u8>>>) -> Self {
        Self {
            from,
            chunk: Vec::new(),
            at: 0,
        }
    }
}

impl Read for Handed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.from.recv() {
                Ok(Ok(chunk)) => (self.chunk, self.at) = (chunk, 0),
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// What the reading thread saw of a layer: its uncompressed digest (hex),
/// the budget's bytes left, and whether it went over.
pub(super) struct ReadLayer {
    pub digest: String,
    pub left: u64,
    pub over: bool,
}

/// Inflates `layer` and hashes it, at most `left` bytes, sending it on in
/// chunks until the end, an error (sent on too) or a receiver gone.
pub(super) fn read_ahead(
    layer: impl Read,
    left: u64,
    to: SyncSender<io::Result<Vec<u8>>>,
) -> Result<ReadLayer, OciError> {
    let mut hashing = Hashing {
        inner: super::compression::decompressed(layer)?,
        hash: Sha256::new(),
        left,
        over: false,
    };
    loop {
        let mut chunk = vec![0; READ_AHEAD_CHUNK];
        match hashing.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                chunk.truncate(n);
                if to.send(Ok(chunk)).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                let _ = to.send(Err(e));
                break;
            }
        }
    }
    Ok(ReadLayer {
        digest: format!("{:x}", hashing.hash.finalize()),
        left: hashing.left,
        over: hashing.over,
    })
}

/// Reads through to `inner`, hashing every byte, at most `left` of them.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    left: u64,
    over: bool,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.over = true;
            return Err(io::Error::other("the layer is over the image's byte limit"));
        }
        self.left -= n as u64;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}
