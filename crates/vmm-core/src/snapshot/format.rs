//! The state file: a fixed header (magic, format version, payload length,
//! SHA-256 of the payload) and the machine state encoded with postcard.
//! Anything that does not check out is refused before it is decoded.

use serde::{de::DeserializeOwned, Serialize};
use sha2::{Digest, Sha256};

/// First bytes of every state file.
pub const MAGIC: [u8; 8] = *b"MAVMSNAP";
/// The format this build writes and the only one it reads. Bump it on any
/// change to the encoded state.
pub const FORMAT_VERSION: u32 = 3;
/// Magic, version, reserved word, payload length, checksum.
pub const HEADER_LEN: usize = 8 + 4 + 4 + 8 + 32;
/// Largest payload accepted (the state of 255 vCPUs fits many times over).
const MAX_PAYLOAD: u64 = 64 << 20;

/// Why a state file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Shorter than its header says, or than a header.
    #[error("the state file is truncated ({len} bytes, {wanted} expected)")]
    Truncated {
        /// Bytes present.
        len: u64,
        /// Bytes the header promises.
        wanted: u64,
    },
    /// Not a snapshot state file.
    #[error("not a microagent snapshot state file (bad magic)")]
    Magic,
    /// Written by a build with another format.
    #[error("snapshot format version {found}; this build reads version {FORMAT_VERSION}")]
    Version {
        /// The file's version.
        found: u32,
    },
    /// Longer than its header says.
    #[error("the state file has {extra} bytes after its payload")]
    Trailing {
        /// Unexpected bytes.
        extra: u64,
    },
    /// The payload's checksum does not match.
    #[error("the state file is corrupted (checksum mismatch)")]
    Checksum,
    /// The payload passed its checksum but does not decode: a bug or a
    /// format change without a version bump.
    #[error("the state payload does not decode")]
    Decode(#[source] postcard::Error),
    /// The state could not be encoded.
    #[error("the machine state does not encode")]
    Encode(#[source] postcard::Error),
}

/// The whole file for `state`.
pub fn encode<T: Serialize>(state: &T) -> Result<Vec<u8>, FormatError> {
    let payload = postcard::to_stdvec(state).map_err(FormatError::Encode)?;
    Ok(wrap(&payload))
}

/// The whole file around an encoded `payload`: the header, then it (the
/// fuzzers wrap payloads of their own).
pub fn wrap(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(payload);
    out
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().unwrap_or_default())
}

/// The state in `file`, checked whole before it is decoded.
pub fn decode<T: DeserializeOwned>(file: &[u8]) -> Result<T, FormatError> {
    let len = file.len() as u64;
    if file.len() < HEADER_LEN {
        return Err(FormatError::Truncated {
            len,
            wanted: HEADER_LEN as u64,
        });
    }
    if file[..8] != MAGIC {
        return Err(FormatError::Magic);
    }
    let found = le_u32(&file[8..12]);
    if found != FORMAT_VERSION {
        return Err(FormatError::Version { found });
    }
    let payload_len = u64::from_le_bytes(file[16..24].try_into().unwrap_or_default());
    let wanted = (HEADER_LEN as u64).saturating_add(payload_len.min(MAX_PAYLOAD + 1));
    if payload_len > MAX_PAYLOAD || len < wanted {
        return Err(FormatError::Truncated { len, wanted });
    }
    if len > wanted {
        return Err(FormatError::Trailing {
            extra: len - wanted,
        });
    }
    let payload = &file[HEADER_LEN..];
    if Sha256::digest(payload).as_slice() != &file[24..HEADER_LEN] {
        return Err(FormatError::Checksum);
    }
    postcard::from_bytes(payload).map_err(FormatError::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        name: String,
        values: Vec<u64>,
        regs: kvm_bindings::kvm_regs,
    }

    fn sample() -> Sample {
        Sample {
            name: "vm".into(),
            values: vec![1, u64::MAX, 7],
            regs: kvm_bindings::kvm_regs {
                rip: 0x1234,
                rflags: 2,
                ..Default::default()
            },
        }
    }

    #[test]
    fn round_trips() {
        let file = encode(&sample()).unwrap();
        assert_eq!(&file[..8], b"MAVMSNAP");
        assert_eq!(decode::<Sample>(&file).unwrap(), sample());
    }

    #[test]
    fn refuses_another_version() {
        let mut file = encode(&sample()).unwrap();
        file[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        assert!(matches!(
            decode::<Sample>(&file),
            Err(FormatError::Version { found }) if found == FORMAT_VERSION + 1
        ));
    }

    #[test]
    fn refuses_truncation_corruption_and_garbage() {
        let file = encode(&sample()).unwrap();
        for cut in [0, 10, HEADER_LEN, file.len() - 1] {
            assert!(
                matches!(
                    decode::<Sample>(&file[..cut]),
                    Err(FormatError::Truncated { .. })
                ),
                "cut at {cut}"
            );
        }
        let mut flipped = file.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(matches!(
            decode::<Sample>(&flipped),
            Err(FormatError::Checksum)
        ));
        let mut longer = file.clone();
        longer.push(0);
        assert!(matches!(
            decode::<Sample>(&longer),
            Err(FormatError::Trailing { extra: 1 })
        ));
        let mut magic = file.clone();
        magic[0] = b'X';
        assert!(matches!(decode::<Sample>(&magic), Err(FormatError::Magic)));
        let mut huge = file;
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            decode::<Sample>(&huge),
            Err(FormatError::Truncated { .. })
        ));
    }
}
