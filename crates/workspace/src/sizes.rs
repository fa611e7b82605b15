//! Sizes as people and the seeds' clients write them: a number of MiB
//! (`512`) or a number with a unit (`"512m"`, `"1g"`, `"2GiB"`, `"1T"`),
//! for the CLI's flags and the MCP tools' `mem_mib`, `disk_mib` and
//! `size_mib` alike.

use serde::{Deserialize, Deserializer};

/// A size that is not a number of MiB or one with a known unit, or that
/// overflows.
#[derive(Debug, thiserror::Error)]
#[error("size {0:?}: use a number of MiB or one with a unit, e.g. 512m, 1g, 10G")]
pub struct SizeError(String);

/// The MiB in `text`: digits, then optionally `M`, `G` or `T` (either case,
/// with or without `B`/`iB`; powers of 1024), spaces around allowed.
pub fn parse_mib(text: &str) -> Result<u64, SizeError> {
    let bad = || SizeError(text.chars().take(64).collect());
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_uppercase();
    let mut chars = unit.chars();
    let factor: u64 = match chars.next() {
        None | Some('M') => 1,
        Some('G') => 1024,
        Some('T') => 1 << 20,
        _ => return Err(bad()),
    };
    // A unit letter, then nothing, `B` or `iB`: a bare `B` is no unit.
    if !matches!(chars.as_str(), "" | "B" | "IB") {
        return Err(bad());
    }
    n.checked_mul(factor).ok_or_else(bad)
}

/// A size field that may be absent: an integer (MiB) or a string
/// [`parse_mib`] reads. For `#[serde(deserialize_with = ...)]`.
pub fn optional_mib<'de, D: Deserializer<'de>>(from: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Mib(u64),
        Text(String),
    }
    match Option::<Written>::deserialize(from)? {
        None => Ok(None),
        Some(Written::Mib(n)) => Ok(Some(n)),
        Some(Written::Text(t)) => parse_mib(&t).map(Some).map_err(serde::de::Error::custom),
    }
}

/// The JSON schema of a guest memory field (`schemars(schema_with)`).
#[cfg(feature = "schemars")]
pub fn mem_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let limits = base::store::spec::LIMITS;
    schema(limits.min_mem_mib, limits.max_mem_mib)
}

/// The JSON schema of a writable disk field.
#[cfg(feature = "schemars")]
pub fn disk_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let limits = base::store::spec::LIMITS;
    schema(limits.min_disk_mib, limits.max_disk_mib)
}

/// The JSON schema of a volume size field.
#[cfg(feature = "schemars")]
pub fn volume_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let range = base::volumes::SIZE_RANGE_MIB;
    schema(*range.start(), *range.end())
}

/// An integer from `min` to `max` MiB, a string with a unit, or nothing.
#[cfg(feature = "schemars")]
fn schema(min: u64, max: u64) -> schemars::Schema {
    schemars::json_schema!({
        "oneOf": [
            {"type": "integer", "format": "uint64", "minimum": min, "maximum": max},
            {"type": "string", "pattern": "^ *[0-9]+ *([MmGgTt]([Ii]?[Bb])?)? *$"},
            {"type": "null"}
        ]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        for (text, mib) in [
            ("512", 512),
            ("512m", 512),
            ("512M", 512),
            ("512MiB", 512),
            ("1g", 1024),
            ("1G", 1024),
            ("2GiB", 2048),
            ("2gb", 2048),
            (" 10 G ", 10240),
            ("1T", 1 << 20),
        ] {
            assert_eq!(parse_mib(text).unwrap(), mib, "{text}");
        }
        for text in [
            "",
            "g",
            "1.5g",
            "-1",
            "1k",
            "1 gigabyte",
            "99999999999999999999",
        ] {
            assert!(parse_mib(text).is_err(), "{text}");
        }
        // Overflow is an error, never a wrap.
        assert!(parse_mib(&format!("{}T", u64::MAX / 1024)).is_err());
        // The message shows at most 64 characters of what was given.
        let long = "x".repeat(10_000);
        assert!(parse_mib(&long).unwrap_err().to_string().len() < 200);
    }

    #[test]
    fn a_field_takes_an_integer_a_string_or_nothing() {
        #[derive(Deserialize)]
        struct P {
            #[serde(default, deserialize_with = "optional_mib")]
            mem_mib: Option<u64>,
        }
        let read = |j: &str| serde_json::from_str::<P>(j).map(|p| p.mem_mib);
        assert_eq!(read(r#"{"mem_mib": 512}"#).unwrap(), Some(512));
        assert_eq!(read(r#"{"mem_mib": "1g"}"#).unwrap(), Some(1024));
        assert_eq!(read(r#"{"mem_mib": null}"#).unwrap(), None);
        assert_eq!(read(r#"{}"#).unwrap(), None);
        let e = read(r#"{"mem_mib": "lots"}"#).unwrap_err().to_string();
        assert!(e.contains("use a number of MiB"), "{e}");
        assert!(read(r#"{"mem_mib": -5}"#).is_err());
    }
}
