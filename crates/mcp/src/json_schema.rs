//! Tool schemas in standard JSON Schema only: schemars marks Rust number
//! types with formats (`uint8` ... `uint64`, `int32`, `double`, ...) that no
//! JSON Schema draft defines, and TypeScript clients (Ajv, as in the
//! official MCP Inspector) warn on each. Integer ones become
//! `minimum`/`maximum`; float ones go (`number` says it).

use serde_json::{Map, Value};

/// The range of an integer format (`None`: not one of Rust's).
fn range(format: &str) -> Option<(i128, i128)> {
    Some(match format {
        "uint8" => (0, u8::MAX.into()),
        "uint16" => (0, u16::MAX.into()),
        "uint32" => (0, u32::MAX.into()),
        "uint64" | "uint" => (0, u64::MAX.into()),
        "int8" => (i8::MIN.into(), i8::MAX.into()),
        "int16" => (i16::MIN.into(), i16::MAX.into()),
        "int32" => (i32::MIN.into(), i32::MAX.into()),
        "int64" | "int" => (i64::MIN.into(), i64::MAX.into()),
        _ => return None,
    })
}

fn number(n: i128) -> Value {
    // Beyond 2^53 a JSON number is not exact anyway; u64::MAX still parses.
    serde_json::from_str(&n.to_string()).unwrap_or(Value::Null)
}

/// Rewrites every integer `format` in `schema` (recursively) as bounds,
/// keeping tighter bounds already there.
pub fn standardize(schema: &mut Map<String, Value>) {
    if let Some((lo, hi)) = schema.get("format").and_then(Value::as_str).and_then(range) {
        schema.remove("format");
        let existing = |m: &Map<String, Value>, key: &str| m.get(key).and_then(Value::as_f64);
        if existing(schema, "minimum").is_none_or(|v| v < lo as f64) {
            schema.insert("minimum".into(), number(lo));
        }
        if existing(schema, "maximum").is_none_or(|v| v > hi as f64) {
            schema.insert("maximum".into(), number(hi));
        }
    }
    // `number` says it already (`double`, `float`); `ip` (an IPv4 or IPv6
    // address) is not a draft's either, whose `ipv4`/`ipv6` it spans.
    if matches!(
        schema.get("format").and_then(Value::as_str),
        Some("double" | "float" | "ip")
    ) {
        schema.remove("format");
    }
    for value in schema.values_mut() {
        walk(value);
    }
}

fn walk(value: &mut Value) {
    match value {
        Value::Object(map) => standardize(map),
        Value::Array(items) => items.iter_mut().for_each(walk),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integer_formats_become_bounds_everywhere() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "port": {"type": "integer", "format": "uint16", "minimum": 1},
                "n": {"type": ["integer", "null"], "format": "uint64"},
                "list": {"type": "array", "items": {"type": "integer", "format": "int32"}},
                "ip": {"type": "string", "format": "ipv4"},
                "ratio": {"type": "number", "format": "double"}
            },
            "$defs": {"X": {"anyOf": [{"type": "integer", "format": "uint8"}]}}
        });
        standardize(s.as_object_mut().unwrap());
        let p = &s["properties"];
        assert_eq!(
            p["port"],
            json!({"type": "integer", "minimum": 1, "maximum": 65535})
        );
        assert_eq!(p["n"]["minimum"], 0);
        assert_eq!(p["n"]["maximum"].as_u64(), Some(u64::MAX));
        assert_eq!(p["list"]["items"]["minimum"], i32::MIN);
        assert_eq!(p["ip"]["format"], "ipv4", "standard formats stay");
        assert_eq!(p["ratio"], json!({"type": "number"}));
        assert_eq!(
            s["$defs"]["X"]["anyOf"][0],
            json!({"type": "integer", "minimum": 0, "maximum": 255})
        );
        assert!(!s.to_string().contains("uint"), "{s}");
    }
}
