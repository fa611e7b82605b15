//! The byte-level entry points of the input fuzzers, one per parser of
//! untrusted input beyond the virtio queues (those are in
//! `vmm_core::devices::virtio::fuzz`): `cargo xtask fuzz` feeds them
//! structured random inputs on the stable toolchain, and the cargo-fuzz
//! targets in `fuzz/` feed them libFuzzer's (coverage-guided, nightly).
//! Each must neither panic nor hang; the two unpackers also answer to the
//! oracle "nothing outside the destination exists or changed".

use std::path::{Path, PathBuf};

/// A snapshot state file. The first byte chooses: odd, the rest as the
/// file; even, the rest as a payload behind a valid header (the checksum
/// matches, so the decoder itself is reached).
pub fn snapshot_state(data: &[u8]) {
    use vmm_core::snapshot::format::{decode, wrap};
    let Some((choice, rest)) = data.split_first() else {
        return;
    };
    let file = if choice % 2 == 1 {
        rest.to_vec()
    } else {
        wrap(rest)
    };
    let _ = decode::<vmm_core::snapshot::MachineState>(&file);
}

/// A stream of frames as an agent (or something posing as one) sends:
/// each read and its JSON decoded as a response and as a request, until
/// the stream ends or a frame is refused.
pub fn agent_frames(stream: &[u8]) {
    use guest_agent::frame::{decode_json, read_frame};
    let mut reader = stream;
    while let Ok(Some(frame)) = read_frame(&mut reader) {
        let _ = decode_json::<guest_agent::protocol::Response>(&frame);
        let _ = decode_json::<guest_agent::protocol::Request>(&frame);
    }
}

/// A line on a VMM's control socket, as a request and as a response.
pub fn control_line(line: &[u8]) {
    let text = String::from_utf8_lossy(line);
    let _ = serde_json::from_str::<workspace::vmm::control::ControlRequest>(&text);
    let _ = serde_json::from_str::<workspace::vmm::control::ControlResponse>(&text);
}

/// `copy_out`'s unpacker on an archive. The first byte's low bit says
/// whether git metadata is asked for; the rest is the archive.
pub fn host_write_unpack(data: &[u8]) {
    let Some((choice, archive)) = data.split_first() else {
        return;
    };
    let s = Scratch::new("hostwrite");
    let rules = workspace::host::host_write::UnpackRules {
        max_entries: 64,
        git_metadata: choice & 1 == 1,
    };
    let _ = workspace::host::host_write::unpack(archive, &s.dest(), rules);
    s.check(archive);
}

/// An image layer applied to a tree (its diff_id is its own, so the whole
/// layer is applied), within a budget of 1 MiB and 64 entries.
pub fn oci_apply_layer(archive: &[u8]) {
    use sha2::{Digest, Sha256};
    use workspace::images::oci::owners::Owners;
    use workspace::images::oci::unpack::{apply_layer, Budget};
    let diff_id = format!("sha256:{:x}", Sha256::digest(archive));
    let s = Scratch::new("oci");
    let mut owners = Owners::for_this_process();
    let mut budget = Budget::new(1 << 20, 64);
    let _ = apply_layer(&s.dest(), archive, &diff_id, &mut owners, &mut budget);
    s.check(archive);
}

/// An image config, the conversion's input besides the layers: parsed,
/// then its run settings (user, working directory, environment) resolved
/// against a small tree with a passwd and group, which nothing may leave.
pub fn oci_config(data: &[u8]) {
    use workspace::images::oci::config::ImageConfig;
    use workspace::images::oci::ImageDefaults;
    let Ok(config) = ImageConfig::parse(data) else {
        return;
    };
    let s = Scratch::new("config");
    let etc = s.dest().join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    std::fs::write(
        etc.join("passwd"),
        "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(etc.join("group"), "root:x:0:\nuser:x:1000:\n").unwrap();
    let run = config.config.clone().unwrap_or_default();
    let _ = ImageDefaults::from_config(&run, &s.dest());
    s.check(data);
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

    /// The oracle: nothing outside `dest/` exists or changed; otherwise a
    /// panic, with the archive kept for the report.
    fn check(&self, archive: &[u8]) {
        let names = |p: &Path| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(p)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
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
    fn every_entry_point_takes_empty_and_junk_input() {
        for data in [&b""[..], b"\x00", b"\x01{\"op\":", &[0xff; 600]] {
            snapshot_state(data);
            agent_frames(data);
            control_line(data);
            host_write_unpack(data);
            oci_apply_layer(data);
            oci_config(data);
        }
    }
}
