//! Structured random inputs for the input fuzzers beyond the virtio
//! queues, on the stable toolchain: snapshot state files, agent frame
//! streams, control socket lines, and hostile archives for the two
//! unpackers a guest or an image feeds. The checks themselves (and the
//! oracle "nothing outside the destination exists or changed") are
//! `testkit::fuzz`, which the cargo-fuzz targets in `fuzz/` call too.

/// A seeded xorshift64 generator: the same seed, the same inputs.
pub(crate) struct XorShift(pub(crate) u64);

impl XorShift {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random bytes, `len` at most `max`.
fn bytes(rng: &mut XorShift, max: usize) -> Vec<u8> {
    let len = (rng.next() as usize) % (max + 1);
    (0..len).map(|_| rng.next() as u8).collect()
}

/// A snapshot state file, usually behind a valid header (see
/// `testkit::fuzz::snapshot_state` for the choice byte).
pub fn snapshot_state(rng: &mut XorShift) {
    let choice = u8::from(rng.next().is_multiple_of(8));
    let mut data = vec![choice];
    data.extend(bytes(rng, 4096));
    testkit::fuzz::snapshot_state(&data);
}

/// A frame for the egress filter, as `vmm_core`'s `egress_frames` takes
/// it (a length byte, then the frame): a TCP SYN, a DNS question to the
/// resolver, a DNS answer from it (CNAMEs, compression pointers), or
/// junk; then a few bytes changed.
pub fn frames(rng: &mut XorShift) -> Vec<u8> {
    const NAMES: [&[u8]; 4] = [b"allowed.test", b"a.allowed.test", b"denied.test", b""];
    const ADDRS: [[u8; 4]; 5] = [
        [10, 0, 2, 2],
        [10, 0, 2, 3],
        [169, 254, 169, 254],
        [192, 0, 2, 7],
        [10, 0, 2, 15],
    ];
    let name = |rng: &mut XorShift, out: &mut Vec<u8>| {
        for label in NAMES[(rng.next() as usize) % NAMES.len()].split(|&b| b == b'.') {
            out.push(label.len() as u8);
            out.extend_from_slice(label);
        }
        out.push(0);
    };
    let kind = rng.next() % 4;
    let (src, dst) = match kind {
        2 => ([10, 0, 2, 3], [10, 0, 2, 15]),
        1 => ([10, 0, 2, 15], [10, 0, 2, 3]),
        _ => ([10, 0, 2, 15], ADDRS[(rng.next() as usize) % ADDRS.len()]),
    };
    let (protocol, l4) = match kind {
        0 => {
            let mut t = vec![0u8; 20];
            t[2..4].copy_from_slice(&((rng.next() % 9000) as u16).to_be_bytes());
            t[12] = 0x50;
            t[13] = (rng.next() % 0x20) as u8;
            (6u8, t)
        }
        1 | 2 => {
            let mut dns = vec![0x12, 0x34, if kind == 2 { 0x81 } else { 1 }, 0x80, 0, 1, 0];
            dns.extend_from_slice(&[(rng.next() % 5) as u8, 0, 0, 0, 0]);
            name(rng, &mut dns);
            dns.extend_from_slice(&[0, 1, 0, 1]);
            for _ in 0..dns[7] {
                // The question's name by pointer, or a pointer anywhere.
                let pointer = if rng.next().is_multiple_of(4) {
                    rng.next() as u8
                } else {
                    12
                };
                dns.extend_from_slice(&[0xc0, pointer]);
                let cname = rng.next().is_multiple_of(3);
                dns.extend_from_slice(&[0, if cname { 5 } else { 1 }, 0, 1, 0, 0, 0, 60]);
                if cname {
                    let mut target = Vec::new();
                    name(rng, &mut target);
                    dns.extend_from_slice(&(target.len() as u16).to_be_bytes());
                    dns.extend_from_slice(&target);
                } else {
                    dns.extend_from_slice(&[0, 4]);
                    dns.extend_from_slice(&ADDRS[(rng.next() as usize) % ADDRS.len()]);
                }
            }
            let (sport, dport) = if kind == 2 {
                (53u16, 5353u16)
            } else {
                (5353, 53)
            };
            let mut u = Vec::new();
            u.extend_from_slice(&sport.to_be_bytes());
            u.extend_from_slice(&dport.to_be_bytes());
            u.extend_from_slice(&((8 + dns.len()) as u16).to_be_bytes());
            u.extend_from_slice(&[0, 0]);
            u.extend_from_slice(&dns);
            (17u8, u)
        }
        _ => ((rng.next() % 256) as u8, bytes(rng, 64)),
    };
    let mut frame = vec![0u8; 12];
    frame.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 0, 0, 0, 0, 0, 64, protocol, 0, 0]);
    let total = (20 + l4.len()) as u16;
    frame[16..18].copy_from_slice(&total.to_be_bytes());
    frame.extend_from_slice(&src);
    frame.extend_from_slice(&dst);
    frame.extend_from_slice(&l4);
    for _ in 0..(rng.next() % 4) {
        let at = (rng.next() as usize) % frame.len();
        frame[at] = rng.next() as u8;
    }
    frame.truncate(255);
    let mut out = vec![frame.len() as u8];
    out.extend_from_slice(&frame);
    out
}

/// Register accesses for `vmm_core`'s `mmio_registers`: mostly aligned
/// 4-byte accesses to the real registers (the driver's handshake values
/// among the written ones), sometimes anything.
pub fn mmio_accesses(rng: &mut XorShift) -> Vec<u8> {
    // MagicValue .. QueueDeviceHigh, InterruptACK, Status, ConfigGeneration.
    const REGS: [u16; 22] = [
        0x000, 0x004, 0x008, 0x00c, 0x010, 0x014, 0x020, 0x024, 0x030, 0x034, 0x038, 0x044, 0x050,
        0x064, 0x070, 0x080, 0x084, 0x090, 0x094, 0x0a0, 0x0a4, 0x0fc,
    ];
    const VALUES: [u64; 8] = [0, 1, 2, 3, 4, 8, 15, 0x8000_0000];
    let mut out = Vec::new();
    for _ in 0..(rng.next() % 64) {
        let anything = rng.next().is_multiple_of(8);
        let write = rng.next() % 2;
        let width: u8 = if anything { (rng.next() % 4) as u8 } else { 2 };
        let offset = if anything {
            (rng.next() % 0x200) as u16
        } else {
            REGS[(rng.next() as usize) % REGS.len()]
        };
        let value = if rng.next().is_multiple_of(3) {
            rng.next()
        } else {
            VALUES[(rng.next() as usize) % VALUES.len()]
        };
        out.push(write as u8 | (width << 1));
        out.extend_from_slice(&offset.to_le_bytes());
        out.push(0);
        out.extend_from_slice(&value.to_le_bytes());
    }
    out
}

/// JSON-ish text: braces, quotes, the protocol's words, digits.
fn json_ish(rng: &mut XorShift, max: usize) -> Vec<u8> {
    const PIECES: [&str; 20] = [
        "{",
        "}",
        "[",
        "]",
        "\"",
        ":",
        ",",
        "\"op\"",
        "\"snapshot\"",
        "\"dir\"",
        "\"exec\"",
        "\"publish\"",
        "\"host_port\"",
        "\"ok\"",
        "null",
        "true",
        "-1",
        "18446744073709551616",
        "\"\\u0000\"",
        "1e999",
    ];
    let n = (rng.next() as usize) % max;
    let mut out = Vec::new();
    for _ in 0..n {
        if rng.next().is_multiple_of(5) {
            out.push(rng.next() as u8);
        } else {
            out.extend_from_slice(PIECES[(rng.next() as usize) % PIECES.len()].as_bytes());
        }
    }
    out
}

/// A stream of frames as an agent (or something posing as one) sends.
pub fn agent_frames(rng: &mut XorShift) {
    let mut stream = Vec::new();
    for _ in 0..(rng.next() % 6) {
        let payload = json_ish(rng, 40);
        // A length word (kind byte included) that is usually right,
        // sometimes anything.
        let len = if rng.next().is_multiple_of(6) {
            (rng.next() % (2 << 20)) as u32
        } else {
            payload.len() as u32 + 1
        };
        stream.extend_from_slice(&len.to_le_bytes());
        stream.push((rng.next() % 8) as u8);
        stream.extend_from_slice(&payload);
    }
    testkit::fuzz::agent_frames(&stream);
}

/// A line on a VMM's control socket.
pub fn control_line(rng: &mut XorShift) {
    testkit::fuzz::control_line(&json_ish(rng, 30));
}

/// A tar of a few entries with hostile names and link targets, written
/// header by header (tar's builder refuses the hostile ones).
fn hostile_tar(rng: &mut XorShift) -> Vec<u8> {
    const PARTS: [&str; 10] = [
        "a",
        "b",
        "..",
        ".",
        "sub",
        "",
        ".wh.a",
        ".wh..wh..opq",
        ".git",
        "victim",
    ];
    const TARGETS: [&str; 9] = [
        "a",
        "../a",
        "../../outside/victim",
        "/",
        "/etc",
        "sub/../..",
        "..",
        "sub",
        "../outside",
    ];
    let pick = |rng: &mut XorShift, from: &[&'static str]| from[(rng.next() as usize) % from.len()];
    let mut out = Vec::new();
    for _ in 0..(1 + rng.next() % 8) {
        let depth = 1 + rng.next() % 3;
        let mut name = String::new();
        if rng.next().is_multiple_of(10) {
            name.push('/');
        }
        for i in 0..depth {
            if i > 0 {
                name.push('/');
            }
            name.push_str(pick(rng, &PARTS));
        }
        let (kind, link, data): (tar::EntryType, &str, &[u8]) = match rng.next() % 5 {
            0 => (tar::EntryType::Directory, "", b""),
            1 => (tar::EntryType::Symlink, pick(rng, &TARGETS), b""),
            2 => (tar::EntryType::Link, pick(rng, &TARGETS), b""),
            _ => (tar::EntryType::Regular, "", b"data"),
        };
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(if rng.next().is_multiple_of(4) {
            0o4777
        } else {
            0o644
        });
        h.set_size(data.len() as u64);
        if let Some(gnu) = h.as_gnu_mut() {
            let n = name.len().min(gnu.name.len());
            gnu.name[..n].copy_from_slice(&name.as_bytes()[..n]);
            let l = link.len().min(gnu.linkname.len());
            gnu.linkname[..l].copy_from_slice(&link.as_bytes()[..l]);
        }
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// An image config with hostile run settings (users by name and number,
/// working directories above the root), a few bytes changed sometimes.
pub fn oci_config(rng: &mut XorShift) {
    const USERS: [&str; 9] = [
        "root",
        "user",
        "1000",
        "1000:1000",
        "nobody",
        "0:0",
        "user:user",
        "../x",
        "4294967296",
    ];
    const DIRS: [&str; 6] = ["/", "/app", "/../../x", "relative", "/a/../../b", ""];
    let pick = |rng: &mut XorShift, from: &[&'static str]| from[(rng.next() as usize) % from.len()];
    let config = format!(
        r#"{{"os":"linux","architecture":"amd64","config":{{"User":"{}","WorkingDir":"{}","Env":["A=1","=x","B"],"Cmd":["sh"]}},"rootfs":{{"type":"layers","diff_ids":[]}}}}"#,
        pick(rng, &USERS),
        pick(rng, &DIRS)
    );
    let mut data = config.into_bytes();
    if rng.next().is_multiple_of(4) {
        let at = (rng.next() as usize) % data.len();
        data[at] = rng.next() as u8;
    }
    testkit::fuzz::oci_config(&data);
}

/// `copy_out`'s unpacker on a hostile archive, git metadata asked for
/// one time in two.
pub fn host_write_unpack(rng: &mut XorShift) {
    let mut data = vec![(rng.next() % 2) as u8];
    data.extend(hostile_tar(rng));
    testkit::fuzz::host_write_unpack(&data);
}

/// An image layer applied to a tree, on a hostile archive.
pub fn oci_apply_layer(rng: &mut XorShift) {
    testkit::fuzz::oci_apply_layer(&hostile_tar(rng));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_runs_on_a_few_inputs() {
        let mut rng = XorShift(0x5eed);
        for _ in 0..50 {
            snapshot_state(&mut rng);
            agent_frames(&mut rng);
            control_line(&mut rng);
            host_write_unpack(&mut rng);
            oci_apply_layer(&mut rng);
            oci_config(&mut rng);
            let _ = frames(&mut rng);
            let _ = mmio_accesses(&mut rng);
        }
    }
}
