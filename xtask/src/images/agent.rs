//! The guest agent binary (`microagent-agent` of `crates/guest-agent`),
//! built static for the images, or taken from `MICROAGENT_AGENT_BIN`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

use crate::cache::{self, STATIC_TARGET};

/// Overrides the build: a path to a prebuilt static x86-64 binary.
pub const OVERRIDE_VAR: &str = "MICROAGENT_AGENT_BIN";
const CRATE_DIR: &str = "crates/guest-agent";
const PACKAGE: &str = "guest-agent";
const BINARY: &str = "microagent-agent";

/// The agent's bytes and where they came from.
#[derive(Debug)]
pub struct AgentBinary {
    pub bytes: Vec<u8>,
    pub sha256: String,
    /// `crates/guest-agent` or `MICROAGENT_AGENT_BIN=<path>`.
    pub source: String,
}

/// `MICROAGENT_AGENT_BIN` when set, else a static release build of the crate.
pub fn find() -> anyhow::Result<AgentBinary> {
    let (path, source) = match std::env::var_os(OVERRIDE_VAR) {
        Some(p) if !p.is_empty() => {
            let path = PathBuf::from(p);
            let source = format!("{OVERRIDE_VAR}={}", path.display());
            (path, source)
        }
        _ => (build()?, CRATE_DIR.to_owned()),
    };
    let bytes = std::fs::read(&path)
        .with_context(|| format!("reading the guest agent {} ({source})", path.display()))?;
    if let Err(why) = check_static_x86_64(&bytes) {
        bail!(
            "the guest agent {} ({source}) {why}; the images need a static x86-64 binary \
             (RUSTFLAGS=\"-C target-feature=+crt-static\" for --target {STATIC_TARGET})",
            path.display()
        );
    }
    let sha256 = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    eprintln!(
        "xtask: guest agent: {} ({} KiB, {source})",
        path.display(),
        bytes.len() / 1024
    );
    Ok(AgentBinary {
        bytes,
        sha256,
        source,
    })
}

/// What to do when there is no agent to put in the image.
fn no_agent_hint() -> String {
    format!(
        "or set {OVERRIDE_VAR}=/path/to/a/static/x86_64/binary to use a prebuilt one \
         (any static binary will do to try the image build, e.g. {OVERRIDE_VAR}=/bin/busybox)"
    )
}

/// Builds the agent static, in its own target dir so that the workspace's
/// main target dir (built without crt-static) is not invalidated.
fn build() -> anyhow::Result<PathBuf> {
    let repo = cache::repo_root();
    if !repo.join(CRATE_DIR).join("Cargo.toml").is_file() {
        bail!(
            "no guest agent to put in the image: {CRATE_DIR} does not exist in this checkout; \
             add it (package `{PACKAGE}`, binary `{BINARY}`, a workspace member), {}",
            no_agent_hint()
        );
    }
    let build = cache::StaticBuild::new("agent-target")?;
    eprintln!("xtask: building the guest agent (static, {STATIC_TARGET})");
    let status = build.command(PACKAGE).status().context("starting cargo")?;
    if !status.success() {
        bail!(
            "building the guest agent failed ({status}; cargo's errors are above): \
             `cargo build --release -p {PACKAGE} --target {STATIC_TARGET}` with \
             RUSTFLAGS=\"-C target-feature=+crt-static\" must succeed; fix {CRATE_DIR} \
             (it must be a workspace member with a `{BINARY}` binary), {}",
            no_agent_hint()
        );
    }
    Ok(build.binary(BINARY))
}

/// Ok for a 64-bit little-endian x86-64 ELF executable without an
/// interpreter (static or static-pie); otherwise what is wrong with it.
pub fn check_static_x86_64(elf: &[u8]) -> Result<(), String> {
    const PT_INTERP: u32 = 3;
    const EM_X86_64: u16 = 62;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    if elf.get(..4) != Some(b"\x7fELF") {
        return Err("is not an ELF file".into());
    }
    if elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err("is not a 64-bit little-endian ELF file".into());
    }
    if u16_at(18) != Some(EM_X86_64) {
        return Err("is not an x86-64 binary".into());
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return Err("has a truncated ELF header".into());
    };
    for i in 0..usize::from(phnum) {
        let at = usize::try_from(phoff)
            .ok()
            .and_then(|o| o.checked_add(i * usize::from(phentsize)));
        match at.and_then(u32_at) {
            Some(PT_INTERP) => {
                return Err("is dynamically linked (it has an ELF interpreter)".into())
            }
            Some(_) => {}
            None => return Err("has truncated program headers".into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 header with program headers of the given types.
    fn elf(machine: u16, types: &[u32]) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&machine.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for t in types {
            let mut ph = vec![0u8; 56];
            ph[..4].copy_from_slice(&t.to_le_bytes());
            b.extend(ph);
        }
        b
    }

    #[test]
    fn static_check() {
        assert_eq!(check_static_x86_64(&elf(62, &[1, 1, 4])), Ok(()));
        assert!(check_static_x86_64(&elf(62, &[6, 3, 1]))
            .unwrap_err()
            .contains("dynamically"));
        assert!(check_static_x86_64(&elf(183, &[1]))
            .unwrap_err()
            .contains("x86-64"));
        assert!(check_static_x86_64(b"#!/bin/sh\n").is_err());
        let mut truncated = elf(62, &[1, 1]);
        truncated.truncate(100);
        assert!(check_static_x86_64(&truncated).is_err());
        // Debian's busybox-static, where installed, is a real static binary.
        if crate::sh::deb_version("busybox-static").is_some() {
            let bytes = std::fs::read("/bin/busybox").unwrap();
            assert_eq!(check_static_x86_64(&bytes), Ok(()));
        }
        if let Ok(bytes) = std::fs::read("/bin/ls") {
            assert!(check_static_x86_64(&bytes).is_err());
        }
    }
}
