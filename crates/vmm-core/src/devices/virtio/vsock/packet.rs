//! virtio-vsock packet headers (virtio 1.2 §5.10.6) and moving packets
//! between descriptor chains and host buffers.

use std::io::{self, Read};
use std::ops::Deref;

use virtio_queue::{DescriptorChain, Reader};

use crate::memory::GuestMemory;

/// Size of `struct virtio_vsock_hdr` on the wire.
pub const HDR_SIZE: usize = 44;
/// The host's context id.
pub const HOST_CID: u64 = 2;
/// Largest payload the device accepts or produces in one packet. Linux uses
/// 64 KiB as well; anything larger from the guest is malformed.
pub const MAX_PKT_PAYLOAD: usize = 64 * 1024;

/// `type`: connection-oriented stream, the only one supported.
pub const TYPE_STREAM: u16 = 1;

/// Connection request.
pub const OP_REQUEST: u16 = 1;
/// Connection accepted.
pub const OP_RESPONSE: u16 = 2;
/// Connection reset (refused, aborted or fully closed).
pub const OP_RST: u16 = 3;
/// The sender will not receive and/or send any more.
pub const OP_SHUTDOWN: u16 = 4;
/// Payload data.
pub const OP_RW: u16 = 5;
/// Unsolicited credit information.
pub const OP_CREDIT_UPDATE: u16 = 6;
/// Asks the peer for its credit information.
pub const OP_CREDIT_REQUEST: u16 = 7;

/// SHUTDOWN flag: the sender will receive no more data.
pub const SHUTDOWN_RCV: u32 = 1;
/// SHUTDOWN flag: the sender will send no more data.
pub const SHUTDOWN_SEND: u32 = 2;

/// A packet header, in host byte order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketHeader {
    /// Source context id.
    pub src_cid: u64,
    /// Destination context id.
    pub dst_cid: u64,
    /// Source port.
    pub src_port: u32,
    /// Destination port.
    pub dst_port: u32,
    /// Payload length.
    pub len: u32,
    /// Socket type (`TYPE_STREAM`).
    pub type_: u16,
    /// Operation (`OP_*`).
    pub op: u16,
    /// Operation flags (`SHUTDOWN_*` for `OP_SHUTDOWN`).
    pub flags: u32,
    /// Receive buffer space of the sender, for flow control.
    pub buf_alloc: u32,
    /// Bytes the sender has consumed from its receive buffer.
    pub fwd_cnt: u32,
}

impl PacketHeader {
    /// Decodes a little-endian wire header.
    pub fn from_bytes(b: &[u8; HDR_SIZE]) -> Self {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap_or_default());
        Self {
            src_cid: u64_at(0),
            dst_cid: u64_at(8),
            src_port: u32_at(16),
            dst_port: u32_at(20),
            len: u32_at(24),
            type_: u16_at(28),
            op: u16_at(30),
            flags: u32_at(32),
            buf_alloc: u32_at(36),
            fwd_cnt: u32_at(40),
        }
    }

    /// Encodes the header in wire (little-endian) format.
    pub fn to_bytes(self) -> [u8; HDR_SIZE] {
        let mut b = [0u8; HDR_SIZE];
        b[0..8].copy_from_slice(&self.src_cid.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst_cid.to_le_bytes());
        b[16..20].copy_from_slice(&self.src_port.to_le_bytes());
        b[20..24].copy_from_slice(&self.dst_port.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..30].copy_from_slice(&self.type_.to_le_bytes());
        b[30..32].copy_from_slice(&self.op.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.buf_alloc.to_le_bytes());
        b[40..44].copy_from_slice(&self.fwd_cnt.to_le_bytes());
        b
    }
}

/// Why a tx descriptor chain could not be read as a packet.
#[derive(Debug, thiserror::Error)]
pub enum PacketError {
    /// The chain points outside guest memory or is otherwise unusable.
    #[error("the descriptor chain does not describe valid guest memory")]
    Chain(#[source] virtio_queue::Error),
    /// Fewer readable bytes than a header.
    #[error("the chain holds {0} readable bytes, fewer than a {HDR_SIZE}-byte header")]
    ShortHeader(usize),
    /// `len` is beyond what the device accepts.
    #[error("payload length {0} exceeds the {MAX_PKT_PAYLOAD}-byte maximum")]
    PayloadTooLong(u32),
    /// `len` is beyond the chain's readable bytes.
    #[error("payload length {len} exceeds the {avail} bytes left in the chain")]
    PayloadBeyondChain {
        /// Claimed payload length.
        len: u32,
        /// Readable bytes after the header.
        avail: usize,
    },
    /// Copying from guest memory failed.
    #[error("copying the packet out of guest memory failed")]
    Read(#[source] io::Error),
}

/// Reads the packet in a tx chain (device-readable descriptors only): the
/// header is returned and the payload (`hdr.len` bytes) left in `payload`.
/// `payload` never grows beyond [`MAX_PKT_PAYLOAD`].
pub fn read_tx_packet<M>(
    mem: &GuestMemory,
    chain: DescriptorChain<M>,
    payload: &mut Vec<u8>,
) -> Result<PacketHeader, PacketError>
where
    M: Deref<Target = GuestMemory>,
{
    payload.clear();
    let mut reader: Reader<'_, ()> = Reader::new(mem, chain).map_err(PacketError::Chain)?;
    let avail = reader.available_bytes();
    if avail < HDR_SIZE {
        return Err(PacketError::ShortHeader(avail));
    }
    let mut raw = [0u8; HDR_SIZE];
    reader.read_exact(&mut raw).map_err(PacketError::Read)?;
    let hdr = PacketHeader::from_bytes(&raw);
    let len = hdr.len as usize;
    if len > MAX_PKT_PAYLOAD {
        return Err(PacketError::PayloadTooLong(hdr.len));
    }
    let avail = reader.available_bytes();
    if len > avail {
        return Err(PacketError::PayloadBeyondChain {
            len: hdr.len,
            avail,
        });
    }
    payload.resize(len, 0);
    reader.read_exact(payload).map_err(PacketError::Read)?;
    Ok(hdr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_in_little_endian() {
        let hdr = PacketHeader {
            src_cid: 0x0102_0304_0506_0708,
            dst_cid: 2,
            src_port: 0x1122_3344,
            dst_port: 1234,
            len: 5,
            type_: TYPE_STREAM,
            op: OP_RW,
            flags: SHUTDOWN_SEND,
            buf_alloc: 256 * 1024,
            fwd_cnt: 77,
        };
        let b = hdr.to_bytes();
        assert_eq!(b[0], 0x08);
        assert_eq!(b[7], 0x01);
        assert_eq!(&b[16..20], &[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&b[28..32], &[1, 0, 5, 0]);
        assert_eq!(PacketHeader::from_bytes(&b), hdr);
    }
}
