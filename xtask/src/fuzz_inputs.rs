//! The input fuzzers beyond the virtio queues, on the stable toolchain:
//! the snapshot state decoder, the agent's frame reader and the JSON it
//! carries, the VMM control socket's request lines, and the two archive
//! unpackers a guest or an image feeds (`copy_out`'s `host_write::unpack`,
//! an image layer's `oci::unpack::apply_layer`) with the oracle "nothing
//! outside the destination exists or changed". A panic fails the run.

use std::path::{Path, PathBuf};

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

/// A snapshot state file with a valid header around a random payload (the
/// checksum matches, so the decoder itself is reached), or random bytes.
pub fn snapshot_state(rng: &mut XorShift) {
    use vmm_core::snapshot::format::{decode, wrap, HEADER_LEN};
    let file = if rng.next().is_multiple_of(8) {
        bytes(rng, HEADER_LEN * 2)
    } else {
        wrap(&bytes(rng, 4096))
    };
    let _ = decode::<vmm_core::snapshot::MachineState>(&file);
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

/// A stream of frames as an agent (or something posing as one) sends:
/// each read and its JSON decoded as a response, until the stream ends or
/// a frame is refused.
pub fn agent_frames(rng: &mut XorShift) {
    use guest_agent::frame::{decode_json, read_frame};
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
    let mut reader = &stream[..];
    while let Ok(Some(frame)) = read_frame(&mut reader) {
        let _ = decode_json::<guest_agent::protocol::Response>(&frame);
        let _ = decode_json::<guest_agent::protocol::Request>(&frame);
    }
}

/// A line on a VMM's control socket.
pub fn control_line(rng: &mut XorShift) {
    let line = json_ish(rng, 30);
    let text = String::from_utf8_lossy(&line);
    let _ = serde_json::from_str::<workspace::vmm::control::ControlRequest>(&text);
    let _ = serde_json::from_str::<workspace::vmm::control::ControlResponse>(&text);
}

/// A scratch directory with `dest/` and `outside/victim`.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ma-fuzz-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("dest")).unwrap();
        std::fs::create_dir_all(dir.join("outside")).unwrap();
        std::fs::write(dir.join("outside/victim"), "untouched").unwrap();
        Scratch { dir }
    }

    fn dest(&self) -> PathBuf {
        self.dir.join("dest")
    }

    /// The oracle: nothing outside `dest/` exists or changed.
    fn check(&self, archive: &[u8]) {
        let names = |p: &Path| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        let ok = names(&self.dir) == ["dest", "outside"]
            && names(&self.dir.join("outside")) == ["victim"]
            && std::fs::symlink_metadata(self.dir.join("outside/victim"))
                .is_ok_and(|m| m.is_file())
            && std::fs::read(self.dir.join("outside/victim"))
                .ok()
                .as_deref()
                == Some(b"untouched");
        if !ok {
            let kept =
                std::env::temp_dir().join(format!("ma-fuzz-escape-{}.tar", std::process::id()));
            let _ = std::fs::write(&kept, archive);
            panic!(
                "an archive reached outside its destination {}; it is kept at {}",
                self.dir.display(),
                kept.display()
            );
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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

/// `copy_out`'s unpacker on a hostile archive.
pub fn host_write_unpack(rng: &mut XorShift) {
    let archive = hostile_tar(rng);
    let s = Scratch::new("hostwrite");
    let rules = workspace::host::host_write::UnpackRules {
        max_entries: 64,
        git_metadata: rng.next().is_multiple_of(2),
    };
    let _ = workspace::host::host_write::unpack(&archive[..], &s.dest(), rules);
    s.check(&archive);
}

/// An image layer applied to a tree, on a hostile archive (its diff_id is
/// its own, so the whole layer is applied).
pub fn oci_apply_layer(rng: &mut XorShift) {
    use sha2::{Digest, Sha256};
    use workspace::images::oci::owners::Owners;
    use workspace::images::oci::unpack::{apply_layer, Budget};
    let archive = hostile_tar(rng);
    let diff_id = format!("sha256:{:x}", Sha256::digest(&archive));
    let s = Scratch::new("oci");
    let mut owners = Owners::for_this_process();
    let mut budget = Budget::new(1 << 20, 64);
    let _ = apply_layer(&s.dest(), &archive[..], &diff_id, &mut owners, &mut budget);
    s.check(&archive);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "reached outside")]
    fn the_oracle_sees_a_file_written_outside() {
        let s = Scratch::new("oracle");
        std::fs::write(s.dir.join("outside/planted"), "x").unwrap();
        s.check(b"");
    }

    #[test]
    fn every_target_runs_on_a_few_inputs() {
        let mut rng = XorShift(0x5eed);
        for _ in 0..50 {
            snapshot_state(&mut rng);
            agent_frames(&mut rng);
            control_line(&mut rng);
            host_write_unpack(&mut rng);
            oci_apply_layer(&mut rng);
        }
    }
}
