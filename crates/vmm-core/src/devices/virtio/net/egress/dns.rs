//! The DNS the egress filter reads (RFC 1035 over UDP): a query's one
//! question, and an answer's A and AAAA records reached from its question
//! through CNAMEs, with their TTLs. Messages come from the guest or from a
//! resolver the guest reached, so they are untrusted: names are at most
//! 255 bytes, compression pointers must point backwards and are followed
//! at most 16 times, every count is checked against the bytes there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const HEADER: usize = 12;
const MAX_NAME: usize = 255;
const MAX_JUMPS: usize = 16;
/// Records read from one answer at most.
const MAX_RECORDS: usize = 64;
const TYPE_A: u16 = 1;
const TYPE_CNAME: u16 = 5;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const FLAG_QR: u16 = 0x8000;
const RCODE_REFUSED: u16 = 5;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The name at `at`, lowercased, without the root's dot; and where the
/// bytes after it start.
fn read_name(msg: &[u8], at: usize) -> Option<(String, usize)> {
    let mut name = String::new();
    let mut pos = at;
    let mut end = None;
    let mut jumps = 0;
    loop {
        let len = *msg.get(pos)?;
        match len >> 6 {
            0 if len == 0 => {
                return Some((name, end.unwrap_or(pos + 1)));
            }
            0 => {
                let label = msg.get(pos + 1..pos + 1 + usize::from(len))?;
                if !name.is_empty() {
                    name.push('.');
                }
                for &c in label {
                    // Bytes a hostname cannot hold are kept visible, never
                    // matched against a rule by accident.
                    if c.is_ascii_graphic() && c != b'.' {
                        name.push(char::from(c.to_ascii_lowercase()));
                    } else {
                        name.push('?');
                    }
                }
                if name.len() > MAX_NAME {
                    return None;
                }
                pos += 1 + usize::from(len);
            }
            3 => {
                let target = usize::from(be16(msg, pos)? & 0x3fff);
                // Backwards only, and not forever.
                if target >= pos || jumps == MAX_JUMPS {
                    return None;
                }
                jumps += 1;
                end.get_or_insert(pos + 2);
                pos = target;
            }
            _ => return None,
        }
    }
}

/// A query's question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    /// The name asked about, lowercased, no trailing dot.
    pub name: String,
    /// Where the question ends in the message.
    end: usize,
}

/// The question of `msg` if it is a query (not an answer) with exactly
/// one.
pub fn query(msg: &[u8]) -> Option<Question> {
    let flags = be16(msg, 2)?;
    if flags & FLAG_QR != 0 || be16(msg, 4)? != 1 {
        return None;
    }
    let (name, after) = read_name(msg, HEADER)?;
    // Type and class.
    msg.get(after..after + 4)?;
    Some(Question {
        name,
        end: after + 4,
    })
}

/// The answer that refuses `msg`'s question: its ID and question, RCODE 5
/// (REFUSED), nothing else.
pub fn refused(msg: &[u8], question: &Question) -> Option<Vec<u8>> {
    let mut out = msg.get(..question.end)?.to_vec();
    let flags = be16(msg, 2)?;
    // QR, the same opcode and RD, RA set, REFUSED.
    let answer = FLAG_QR | (flags & 0x7900) | 0x0080 | RCODE_REFUSED;
    out[2..4].copy_from_slice(&answer.to_be_bytes());
    // One question; no answers, authorities or additional records.
    out[4..12].copy_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    Some(out)
}

/// An address an answer gives for a name, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Learned {
    /// The address.
    pub addr: IpAddr,
    /// Its TTL (capped by the CNAMEs that led to it).
    pub ttl_secs: u32,
}

/// An answer's question name and the addresses it gives for it: A and
/// AAAA records of the name or of a name a CNAME chain from it reaches,
/// each with its TTL (a CNAME's TTL caps the records behind it).
pub fn answer(msg: &[u8]) -> Option<(String, Vec<Learned>)> {
    let flags = be16(msg, 2)?;
    if flags & FLAG_QR == 0 || be16(msg, 4)? != 1 {
        return None;
    }
    let answers = usize::from(be16(msg, 6)?).min(MAX_RECORDS);
    let (question, mut pos) = read_name(msg, HEADER)?;
    pos += 4;
    // (owner, kind, ttl, data) of each answer record.
    let mut records = Vec::with_capacity(answers);
    for _ in 0..answers {
        let (owner, after) = read_name(msg, pos)?;
        let kind = be16(msg, after)?;
        let class = be16(msg, after + 2)?;
        let ttl = be32(msg, after + 4)?;
        let len = usize::from(be16(msg, after + 8)?);
        let data_at = after + 10;
        let data = msg.get(data_at..data_at + len)?;
        pos = data_at + len;
        if class != CLASS_IN {
            continue;
        }
        let value = match kind {
            TYPE_A => match <[u8; 4]>::try_from(data) {
                Ok(o) => Record::Addr(IpAddr::V4(Ipv4Addr::from(o))),
                Err(_) => continue,
            },
            TYPE_AAAA => match <[u8; 16]>::try_from(data) {
                Ok(o) => Record::Addr(IpAddr::V6(Ipv6Addr::from(o))),
                Err(_) => continue,
            },
            TYPE_CNAME => match read_name(msg, data_at) {
                Some((target, _)) => Record::Alias(target),
                None => continue,
            },
            _ => continue,
        };
        records.push((owner, ttl, value));
    }
    // Follow the chain from the question: names it reaches, with the
    // smallest TTL on the way.
    let mut reached = vec![(question.clone(), u32::MAX)];
    let mut learned = Vec::new();
    let mut i = 0;
    while i < reached.len() && i <= MAX_RECORDS {
        let (name, cap) = reached[i].clone();
        for (owner, ttl, value) in &records {
            if *owner != name {
                continue;
            }
            let ttl_secs = (*ttl).min(cap);
            match value {
                Record::Addr(addr) => learned.push(Learned {
                    addr: *addr,
                    ttl_secs,
                }),
                Record::Alias(target) if !reached.iter().any(|(n, _)| n == target) => {
                    reached.push((target.clone(), ttl_secs));
                }
                Record::Alias(_) => {}
            }
        }
        i += 1;
    }
    Some((question, learned))
}

enum Record {
    Addr(IpAddr),
    Alias(String),
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn name(out: &mut Vec<u8>, name: &str) {
        for label in name.split('.') {
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.push(0);
    }

    /// A query for `qname` (type A), ID 0x1234, recursion desired.
    pub fn query_for(qname: &str) -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        name(&mut m, qname);
        m.extend_from_slice(&[0, 1, 0, 1]);
        m
    }

    /// An answer to `qname`: a CNAME to `alias` (TTL 600) when given, then
    /// A records of the last name with TTL `ttl`.
    pub fn answer_for(qname: &str, alias: Option<&str>, addrs: &[[u8; 4]], ttl: u32) -> Vec<u8> {
        let mut m = vec![0x12, 0x34, 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0];
        let count = addrs.len() + usize::from(alias.is_some());
        m[7] = count as u8;
        name(&mut m, qname);
        m.extend_from_slice(&[0, 1, 0, 1]);
        let mut owner: Vec<u8> = vec![0xc0, 12];
        if let Some(alias) = alias {
            m.extend_from_slice(&owner);
            m.extend_from_slice(&[0, 5, 0, 1]);
            m.extend_from_slice(&600u32.to_be_bytes());
            let mut target = Vec::new();
            name(&mut target, alias);
            m.extend_from_slice(&(target.len() as u16).to_be_bytes());
            let at = m.len();
            m.extend_from_slice(&target);
            owner = vec![0xc0, at as u8];
        }
        for a in addrs {
            m.extend_from_slice(&owner);
            m.extend_from_slice(&[0, 1, 0, 1]);
            m.extend_from_slice(&ttl.to_be_bytes());
            m.extend_from_slice(&[0, 4]);
            m.extend_from_slice(a);
        }
        m
    }

    #[test]
    fn a_query_is_read_and_refused() {
        let q = query_for("PyPI.org");
        let question = query(&q).unwrap();
        assert_eq!(question.name, "pypi.org");
        let r = refused(&q, &question).unwrap();
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(be16(&r, 2).unwrap() & 0x800f, FLAG_QR | RCODE_REFUSED);
        assert_eq!(query(&r), None, "an answer is not a query");
        assert_eq!(answer(&r).unwrap(), ("pypi.org".to_owned(), Vec::new()));
    }

    #[test]
    fn answers_give_addresses_through_cnames_with_the_smaller_ttl() {
        let m = answer_for(
            "files.example",
            Some("cdn.example"),
            &[[192, 0, 2, 7]],
            3600,
        );
        let (q, learned) = answer(&m).unwrap();
        assert_eq!(q, "files.example");
        assert_eq!(
            learned,
            [Learned {
                addr: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7)),
                ttl_secs: 600
            }]
        );
        let m = answer_for("a.example", None, &[[192, 0, 2, 1], [192, 0, 2, 2]], 30);
        assert_eq!(answer(&m).unwrap().1.len(), 2);
    }

    #[test]
    fn hostile_names_are_refused_not_followed() {
        // A pointer to itself, and one forwards.
        let mut m = query_for("x");
        m.truncate(HEADER);
        m.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        assert_eq!(query(&m), None);
        let mut m = query_for("x");
        m.truncate(HEADER);
        m.extend_from_slice(&[0xc0, 40, 0, 1, 0, 1]);
        assert_eq!(query(&m), None);
        // A name over 255 bytes.
        let long = vec!["a".repeat(63); 5].join(".");
        assert_eq!(query(&query_for(&long)), None);
        // Every cut of an answer reads or refuses, never panics.
        let m = answer_for("files.example", Some("cdn.example"), &[[192, 0, 2, 7]], 60);
        for cut in 0..m.len() {
            let _ = answer(&m[..cut]);
            let _ = query(&m[..cut]);
        }
    }
}
