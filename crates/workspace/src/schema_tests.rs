//! The JSON schemas of the types front ends return (feature `schemars`):
//! objects whose every property is described, for the clients that show
//! them to a model. That they match the serde output is checked where they
//! are used, against real values (`crates/mcp/tests/schemas.rs`).

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::Value;

/// The schema of what `T` serializes to.
fn schema<T: JsonSchema>() -> Value {
    let root = SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<T>();
    serde_json::to_value(root).unwrap()
}

/// Collects the paths of the properties in `schema` that have no
/// description. A tag property (a `const`) describes itself.
fn undescribed(schema: &Value, path: &str, out: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get("properties") {
                for (name, prop) in props {
                    let described = prop
                        .get("description")
                        .and_then(Value::as_str)
                        .is_some_and(|d| !d.trim().is_empty());
                    if !described && prop.get("const").is_none() {
                        out.push(format!("{path}/properties/{name}"));
                    }
                }
            }
            for (key, value) in map {
                undescribed(value, &format!("{path}/{key}"), out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                undescribed(item, &format!("{path}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn every_property_of_every_result_type_is_described() {
    let schemas = [
        ("Meta", schema::<base::store::spec::Meta>()),
        (
            "WorkspaceInfo",
            schema::<crate::workspaces::manager::WorkspaceInfo>(),
        ),
        (
            "Contract",
            schema::<crate::workspaces::contract::Contract>(),
        ),
        ("Report", schema::<crate::host::doctor::Report>()),
        ("ImageInfo", schema::<base::images::registry::ImageInfo>()),
        ("Event", schema::<base::store::events::Event>()),
        ("ExecResult", schema::<crate::guest::request::ExecResult>()),
    ];
    for (name, schema) in schemas {
        assert_eq!(schema["type"], "object", "{name}: {schema:#}");
        let mut missing = Vec::new();
        undescribed(&schema, "", &mut missing);
        assert!(missing.is_empty(), "{name}: undescribed {missing:?}");
    }
}

/// The `const` of each alternative of an enum's schema, in order.
fn names(schema: &Value) -> Vec<&str> {
    schema["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["const"].as_str().unwrap())
        .collect()
}

#[test]
fn enums_list_their_serde_names() {
    let states = schema::<base::store::state::State>();
    let expected: Vec<&str> = base::store::state::State::ALL
        .iter()
        .map(|s| s.as_str())
        .collect();
    assert_eq!(names(&states), expected);
    let codes = schema::<base::code::ErrorCode>();
    let expected: Vec<&str> = base::code::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    assert_eq!(names(&codes), expected);
}
