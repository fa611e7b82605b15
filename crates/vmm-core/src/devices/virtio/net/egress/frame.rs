//! The frames the egress filter reads and the ones it writes: Ethernet II
//! carrying IPv4 (TCP, UDP, ICMP) or IPv6. Parsing takes a frame as the
//! guest sent it, untrusted: every length and offset is checked and
//! nothing panics. Building makes the filter's own answers to the guest (a
//! TCP reset, a UDP datagram) with correct checksums.

use std::net::{IpAddr, Ipv4Addr};

/// Bytes of an Ethernet II header.
pub const ETH_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Bytes of an IPv4 header without options.
const IPV4_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;
/// IP protocol numbers.
pub const PROTO_ICMP: u8 = 1;
/// TCP.
pub const PROTO_TCP: u8 = 6;
/// UDP.
pub const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;
const TCP_HEADER: usize = 20;
const UDP_HEADER: usize = 8;
/// TCP's SYN flag.
pub const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
/// TCP's ACK flag.
pub const TCP_ACK: u8 = 0x10;

/// What an IP packet carries, as far as the filter needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// TCP: ports, sequence number, flags, payload length.
    Tcp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// Sequence number.
        seq: u32,
        /// Flags (SYN, ACK, RST, ...).
        flags: u8,
        /// Bytes of data after the header.
        payload_len: usize,
    },
    /// UDP: ports and where the payload is in the frame.
    Udp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// Where the payload starts in the frame.
        payload_at: usize,
        /// Its length.
        payload_len: usize,
    },
    /// ICMP or ICMPv6, its type.
    Icmp {
        /// The message type.
        kind: u8,
    },
    /// A fragment past the first (no transport header), or another
    /// protocol.
    Opaque {
        /// The IP protocol number.
        protocol: u8,
    },
}

impl Transport {
    /// The destination port, where the packet shows one.
    pub fn dst_port(&self) -> Option<u16> {
        match *self {
            Transport::Tcp { dst_port, .. } | Transport::Udp { dst_port, .. } => Some(dst_port),
            _ => None,
        }
    }
}

/// An IP packet in an Ethernet frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// The sender's MAC address.
    pub src_mac: [u8; 6],
    /// The receiver's.
    pub dst_mac: [u8; 6],
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// What it carries.
    pub transport: Transport,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn mac(b: &[u8], at: usize) -> Option<[u8; 6]> {
    b.get(at..at + 6)?.try_into().ok()
}

/// The IP packet in `frame`; None for what is not IP (ARP and the like),
/// and for an IP frame too short or malformed to read, which the caller
/// tells apart with [`is_ip`].
pub fn parse(frame: &[u8]) -> Option<Packet> {
    let dst_mac = mac(frame, 0)?;
    let src_mac = mac(frame, 6)?;
    match be16(frame, 12)? {
        ETHERTYPE_IPV4 => parse_v4(frame, src_mac, dst_mac),
        ETHERTYPE_IPV6 => parse_v6(frame, src_mac, dst_mac),
        _ => None,
    }
}

/// Whether `frame` says it carries IP (v4 or v6).
pub fn is_ip(frame: &[u8]) -> bool {
    matches!(be16(frame, 12), Some(ETHERTYPE_IPV4 | ETHERTYPE_IPV6))
}

fn parse_v4(frame: &[u8], src_mac: [u8; 6], dst_mac: [u8; 6]) -> Option<Packet> {
    let ip = frame.get(ETH_HEADER..)?;
    let first = *ip.first()?;
    let header_len = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || header_len < IPV4_HEADER || ip.len() < header_len {
        return None;
    }
    // The packet ends where its total length says (Ethernet may pad).
    let total = usize::from(be16(ip, 2)?);
    if total < header_len || total > ip.len() {
        return None;
    }
    let fragment = be16(ip, 6)?;
    let protocol = ip[9];
    let src = IpAddr::V4(Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]));
    let dst = IpAddr::V4(Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]));
    let later_fragment = fragment & 0x1fff != 0;
    let transport = if later_fragment {
        Transport::Opaque { protocol }
    } else {
        let l4_at = ETH_HEADER + header_len;
        transport(frame, protocol, l4_at, ETH_HEADER + total)
    };
    Some(Packet {
        src_mac,
        dst_mac,
        src,
        dst,
        transport,
    })
}

fn parse_v6(frame: &[u8], src_mac: [u8; 6], dst_mac: [u8; 6]) -> Option<Packet> {
    let ip = frame.get(ETH_HEADER..ETH_HEADER + IPV6_HEADER)?;
    if ip[0] >> 4 != 6 {
        return None;
    }
    let payload = usize::from(be16(ip, 4)?);
    let end = ETH_HEADER + IPV6_HEADER + payload;
    if end > frame.len() {
        return None;
    }
    let addr = |at: usize| -> Option<IpAddr> {
        let octets: [u8; 16] = ip.get(at..at + 16)?.try_into().ok()?;
        Some(IpAddr::from(octets))
    };
    // Extension headers are not followed: what is behind one is opaque.
    let next = ip[6];
    let transport = transport(frame, next, ETH_HEADER + IPV6_HEADER, end);
    Some(Packet {
        src_mac,
        dst_mac,
        src: addr(8)?,
        dst: addr(24)?,
        transport,
    })
}

/// The transport header at `at`, the packet ending at `end`.
fn transport(frame: &[u8], protocol: u8, at: usize, end: usize) -> Transport {
    let opaque = Transport::Opaque { protocol };
    let Some(l4) = frame.get(at..end) else {
        return opaque;
    };
    match protocol {
        PROTO_TCP => {
            let (Some(src_port), Some(dst_port), Some(seq)) =
                (be16(l4, 0), be16(l4, 2), be32(l4, 4))
            else {
                return opaque;
            };
            let Some(&offset) = l4.get(12) else {
                return opaque;
            };
            let header = usize::from(offset >> 4) * 4;
            if header < TCP_HEADER || header > l4.len() {
                return opaque;
            }
            Transport::Tcp {
                src_port,
                dst_port,
                seq,
                flags: l4[13],
                payload_len: l4.len() - header,
            }
        }
        PROTO_UDP => match (be16(l4, 0), be16(l4, 2), be16(l4, 4)) {
            (Some(src_port), Some(dst_port), Some(len))
                if usize::from(len) >= UDP_HEADER && usize::from(len) <= l4.len() =>
            {
                Transport::Udp {
                    src_port,
                    dst_port,
                    payload_at: at + UDP_HEADER,
                    payload_len: usize::from(len) - UDP_HEADER,
                }
            }
            _ => opaque,
        },
        PROTO_ICMP | PROTO_ICMPV6 => match l4.first() {
            Some(&kind) => Transport::Icmp { kind },
            None => opaque,
        },
        _ => opaque,
    }
}

/// The Internet checksum (RFC 1071) of `parts` in order.
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum = 0u32;
    let mut odd: Option<u8> = None;
    for part in parts {
        for &byte in *part {
            match odd.take() {
                Some(high) => sum += u32::from(u16::from_be_bytes([high, byte])),
                None => odd = Some(byte),
            }
        }
    }
    if let Some(high) = odd {
        sum += u32::from(u16::from_be_bytes([high, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet + IPv4 frame from `packet`'s destination back to its
/// source, carrying `protocol` and the transport bytes `l4` (whose
/// checksum field, at `checksum_at`, is filled in here).
fn reply_v4(packet: &Packet, protocol: u8, mut l4: Vec<u8>, checksum_at: usize) -> Option<Vec<u8>> {
    let (IpAddr::V4(from), IpAddr::V4(to)) = (packet.dst, packet.src) else {
        return None;
    };
    let total = u16::try_from(IPV4_HEADER + l4.len()).ok()?;
    let mut ip = [0u8; IPV4_HEADER];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = protocol;
    ip[12..16].copy_from_slice(&from.octets());
    ip[16..20].copy_from_slice(&to.octets());
    let sum = checksum(&[&ip]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let length = u16::try_from(l4.len()).ok()?.to_be_bytes();
    let pseudo = [&from.octets()[..], &to.octets(), &[0, protocol], &length];
    let sum = checksum(&[pseudo[0], pseudo[1], pseudo[2], pseudo[3], &l4]);
    l4[checksum_at..checksum_at + 2].copy_from_slice(&sum.to_be_bytes());
    let mut frame = Vec::with_capacity(ETH_HEADER + IPV4_HEADER + l4.len());
    frame.extend_from_slice(&packet.src_mac);
    frame.extend_from_slice(&packet.dst_mac);
    frame.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    frame.extend_from_slice(&ip);
    frame.extend_from_slice(&l4);
    Some(frame)
}

/// The reset that refuses `packet` (an IPv4 TCP segment) at once, as the
/// peer's stack would for a closed port; None for anything else.
pub fn tcp_reset(packet: &Packet) -> Option<Vec<u8>> {
    let Transport::Tcp {
        src_port,
        dst_port,
        seq,
        flags,
        payload_len,
    } = packet.transport
    else {
        return None;
    };
    if flags & TCP_RST != 0 {
        return None;
    }
    // Acknowledges what the segment occupied: its data, and one for SYN.
    let used = payload_len as u32 + u32::from(flags & TCP_SYN != 0);
    let mut tcp = vec![0u8; TCP_HEADER];
    tcp[0..2].copy_from_slice(&dst_port.to_be_bytes());
    tcp[2..4].copy_from_slice(&src_port.to_be_bytes());
    tcp[8..12].copy_from_slice(&seq.wrapping_add(used).to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = TCP_RST | TCP_ACK;
    reply_v4(packet, PROTO_TCP, tcp, 16)
}

/// A UDP datagram answering `packet` (an IPv4 UDP datagram) with
/// `payload`, from its destination address and port.
pub fn udp_reply(packet: &Packet, payload: &[u8]) -> Option<Vec<u8>> {
    let Transport::Udp {
        src_port, dst_port, ..
    } = packet.transport
    else {
        return None;
    };
    let len = u16::try_from(UDP_HEADER + payload.len()).ok()?;
    let mut udp = Vec::with_capacity(usize::from(len));
    udp.extend_from_slice(&dst_port.to_be_bytes());
    udp.extend_from_slice(&src_port.to_be_bytes());
    udp.extend_from_slice(&len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    reply_v4(packet, PROTO_UDP, udp, 6)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub const GUEST_MAC: [u8; 6] = [0x06, 0, 0, 0, 0, 1];
    pub const GATEWAY_MAC: [u8; 6] = [0x9a, 0x55, 0x4a, 0, 0, 2];

    /// An IPv4 frame from 10.0.2.15 (the guest) to `dst`.
    pub fn v4_frame(dst: [u8; 4], protocol: u8, l4: &[u8]) -> Vec<u8> {
        let mut frame = Vec::new();
        frame.extend_from_slice(&GATEWAY_MAC);
        frame.extend_from_slice(&GUEST_MAC);
        frame.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let mut ip = [0u8; IPV4_HEADER];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&((IPV4_HEADER + l4.len()) as u16).to_be_bytes());
        ip[8] = 64;
        ip[9] = protocol;
        ip[12..16].copy_from_slice(&[10, 0, 2, 15]);
        ip[16..20].copy_from_slice(&dst);
        let sum = checksum(&[&ip]);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(l4);
        frame
    }

    /// A TCP segment's header with `flags`, then `payload`.
    pub fn tcp(src_port: u16, dst_port: u16, seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut t = vec![0u8; TCP_HEADER];
        t[0..2].copy_from_slice(&src_port.to_be_bytes());
        t[2..4].copy_from_slice(&dst_port.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = flags;
        t.extend_from_slice(payload);
        t
    }

    /// A UDP datagram's header, then `payload`.
    pub fn udp(src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
        let mut u = Vec::new();
        u.extend_from_slice(&src_port.to_be_bytes());
        u.extend_from_slice(&dst_port.to_be_bytes());
        u.extend_from_slice(&((UDP_HEADER + payload.len()) as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(payload);
        u
    }

    #[test]
    fn a_syn_is_read_and_its_reset_checks_out() {
        let frame = v4_frame(
            [93, 184, 216, 34],
            PROTO_TCP,
            &tcp(40000, 443, 7, TCP_SYN, b""),
        );
        let packet = parse(&frame).unwrap();
        assert_eq!(packet.dst, IpAddr::V4(Ipv4Addr::new(93, 184, 216, 34)));
        assert_eq!(packet.transport.dst_port(), Some(443));
        let reset = tcp_reset(&packet).unwrap();
        let back = parse(&reset).unwrap();
        assert_eq!(back.src, packet.dst);
        assert_eq!(back.dst, packet.src);
        assert_eq!(back.dst_mac, GUEST_MAC);
        match back.transport {
            Transport::Tcp {
                src_port,
                dst_port,
                flags,
                ..
            } => {
                assert_eq!((src_port, dst_port), (443, 40000));
                assert_eq!(flags, TCP_RST | TCP_ACK);
            }
            other => panic!("{other:?}"),
        }
        // It acknowledges the SYN: seq + 1.
        assert_eq!(be32(&reset, ETH_HEADER + IPV4_HEADER + 8), Some(8));
        // Both checksums verify (the sum over a correct header is zero).
        let ip = &reset[ETH_HEADER..ETH_HEADER + IPV4_HEADER];
        assert_eq!(checksum(&[ip]), 0);
        let l4 = &reset[ETH_HEADER + IPV4_HEADER..];
        let pseudo = [
            &ip[12..16],
            &ip[16..20],
            &[0, PROTO_TCP][..],
            &(l4.len() as u16).to_be_bytes()[..],
        ];
        assert_eq!(
            checksum(&[pseudo[0], pseudo[1], pseudo[2], pseudo[3], l4]),
            0
        );
        // A reset is never answered.
        assert_eq!(tcp_reset(&back), None);
    }

    #[test]
    fn udp_payloads_and_fragments_are_placed() {
        let frame = v4_frame([10, 0, 2, 3], PROTO_UDP, &udp(5353, 53, b"query"));
        let packet = parse(&frame).unwrap();
        let Transport::Udp {
            payload_at,
            payload_len,
            ..
        } = packet.transport
        else {
            panic!("{packet:?}");
        };
        assert_eq!(&frame[payload_at..payload_at + payload_len], b"query");
        let answer = udp_reply(&packet, b"answer").unwrap();
        assert_eq!(parse(&answer).unwrap().transport.dst_port(), Some(5353));
        // A later fragment shows no ports.
        let mut fragment = frame.clone();
        fragment[ETH_HEADER + 6] = 0x00;
        fragment[ETH_HEADER + 7] = 0x10;
        let packet = parse(&fragment).unwrap();
        assert_eq!(
            packet.transport,
            Transport::Opaque {
                protocol: PROTO_UDP
            }
        );
    }

    #[test]
    fn malformed_frames_are_not_read_past_their_end() {
        let frame = v4_frame([1, 1, 1, 1], PROTO_TCP, &tcp(1, 2, 3, TCP_SYN, b""));
        for cut in 0..frame.len() {
            let _ = parse(&frame[..cut]);
        }
        // A total length beyond the frame, a header length under 20.
        let mut long = frame.clone();
        long[ETH_HEADER + 2] = 0xff;
        assert_eq!(parse(&long), None);
        let mut short = frame.clone();
        short[ETH_HEADER] = 0x44;
        assert_eq!(parse(&short), None);
        assert!(is_ip(&short));
        // A TCP data offset past the packet: opaque.
        let mut offset = frame;
        offset[ETH_HEADER + IPV4_HEADER + 12] = 0xf0;
        assert_eq!(
            parse(&offset).unwrap().transport,
            Transport::Opaque {
                protocol: PROTO_TCP
            }
        );
    }
}
