//! The tools return the workspace library's own records (`Meta`,
//! `WorkspaceInfo`, `Event`, `doctor::Report`, `Contract`, `ImageInfo`)
//! with the schemas their `schemars` feature derives. These tests check that
//! each schema describes the serde output exactly, over values that cover
//! every variant, every `Option` both ways and every skipped field: each
//! value must match, and no object may carry a property its schema does not
//! name (`unevaluatedProperties: false` is added to every object schema).

use std::collections::BTreeMap;
use std::path::PathBuf;

use mcp::schema::info::{ImageEntry, ImageListResult};
use mcp::schema::lifecycle::{ChangeResult, EventsResult, ListResult};
use serde::Serialize;
use serde_json::{json, Value};
use workspace::host::doctor::{Check, Report, Status};
use workspace::images::ImageInfo;
use workspace::{store::spec::LastExit, store::spec::Runtime};
use workspace::{Event, EventKind};
use workspace::{Meta, State, WorkspaceInfo, WorkspaceSpec};

/// `T`'s output schema, as a tool announces it, with every object schema
/// (the root and each definition) closed to properties it does not name.
fn strict_schema<T: schemars::JsonSchema + 'static>() -> Value {
    let mut schema = Value::Object((*mcp::output::schema::<T>()).clone());
    close(&mut schema);
    if let Some(Value::Object(defs)) = schema.get_mut("$defs") {
        defs.values_mut().for_each(close);
    }
    schema
}

fn close(schema: &mut Value) {
    if schema.get("properties").is_some() {
        schema["unevaluatedProperties"] = json!(false);
    }
}

/// Checks that every value serializes to something `T`'s schema accepts.
fn check<T: schemars::JsonSchema + Serialize + 'static>(values: &[T]) {
    let schema = strict_schema::<T>();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for value in values {
        let json = serde_json::to_value(value).unwrap();
        if let Err(e) = validator.validate(&json) {
            panic!(
                "{} does not match its schema: {e}\nvalue: {json:#}\nschema: {schema:#}",
                std::any::type_name::<T>()
            );
        }
    }
}

/// A record (non-exhaustive: only the library builds one) from its JSON.
fn record<T: serde::de::DeserializeOwned>(json: Value) -> T {
    serde_json::from_value(json).unwrap()
}

fn meta(state: State, runtime: Option<Runtime>, last_exit: Option<LastExit>) -> Meta {
    let spec = WorkspaceSpec {
        env: BTreeMap::from([("K".into(), "v".into())]),
        ttl_secs: runtime.as_ref().map(|_| 60),
        ..WorkspaceSpec::default()
    };
    record(json!({
        "name": "dev",
        "spec": spec,
        "created_at_ms": 1,
        "state": state,
        "runtime": runtime,
        "last_exit": last_exit,
    }))
}

fn metas() -> Vec<Meta> {
    let runtime = |ready: Option<u64>| -> Runtime {
        record(json!({
            "pid": 42,
            "pid_start": 7,
            "started_at_ms": 2,
            "ready_at_ms": ready,
            "ttl_deadline_ms": ready.map(|r| r + 60_000),
        }))
    };
    let exit = |tail: &[&str]| -> LastExit {
        record(json!({
            "at_ms": 3,
            "reason": "stopped on request",
            "console_tail": tail,
        }))
    };
    vec![
        meta(State::Stopped, None, None),
        meta(State::Starting, Some(runtime(None)), None),
        meta(State::Running, Some(runtime(Some(3))), Some(exit(&[]))),
        meta(State::Crashed, None, Some(exit(&["Kernel panic", "end"]))),
    ]
}

#[test]
fn workspace_records_match_their_schemas() {
    check(&metas());
    let infos: Vec<WorkspaceInfo> = metas()
        .into_iter()
        .map(|meta| {
            let mut info = serde_json::to_value(&meta).unwrap();
            let live = json!({
                "uptime_ms": meta.runtime.as_ref().map(|_| 5),
                "dir": PathBuf::from("/home/me/.microagent/workspaces/dev"),
                "age_ms": 9,
                "disk_used_bytes": 4096,
            });
            info.as_object_mut()
                .unwrap()
                .extend(live.as_object().unwrap().clone());
            record::<WorkspaceInfo>(info)
        })
        .collect();
    check(&infos);
    check(&[ListResult {
        count: 4,
        workspaces: metas(),
    }]);
    check(&[ChangeResult {
        preview: true,
        action: "would halt".into(),
        workspace: metas().remove(2),
    }]);
}

#[test]
fn events_of_every_kind_match_their_schema() {
    let kinds = [
        EventKind::Created,
        EventKind::Started {
            start: None,
            ready_ms: None,
        },
        EventKind::Started {
            start: Some(workspace::store::spec::StartKind::Warm),
            ready_ms: Some(40),
        },
        EventKind::ExecStarted {
            exec_id: "e1".into(),
            command: "uname -a".into(),
        },
        EventKind::ExecFinished {
            exec_id: "e1".into(),
            code: Some(0),
            signal: None,
        },
        EventKind::ExecFinished {
            exec_id: "e2".into(),
            code: None,
            signal: Some(9),
        },
        EventKind::Stopped,
        EventKind::Crashed {
            reason: "its VMM died".into(),
        },
        EventKind::TtlExpired,
        EventKind::SnapshotTaken {
            snapshot: "s1".into(),
            has_memory: true,
        },
        EventKind::SnapshotDeleted {
            snapshot: "s1".into(),
        },
        EventKind::Restored {
            snapshot: "s1".into(),
        },
        EventKind::WarmSnapshotDiscarded {
            reason: "the kernel changed".into(),
        },
        EventKind::Forked {
            from: "dev".into(),
            snapshot: None,
        },
    ];
    let events: Vec<Event> = kinds
        .into_iter()
        .zip(1..)
        .map(|(kind, seq)| -> Event {
            let mut event = serde_json::to_value(&kind).unwrap();
            let place = json!({"seq": seq, "at_ms": 100 + seq});
            event
                .as_object_mut()
                .unwrap()
                .extend(place.as_object().unwrap().clone());
            record(event)
        })
        .collect();
    check(&events);
    check(&[EventsResult {
        next_after: events.len() as u64,
        events,
    }]);
    // A property of another kind is not accepted.
    let validator = jsonschema::validator_for(&strict_schema::<Event>()).unwrap();
    let stray = json!({"seq": 1, "at_ms": 2, "kind": "created", "reason": "x"});
    assert!(validator.validate(&stray).is_err());
}

#[test]
fn host_checks_contract_and_images_match_their_schemas() {
    let report = Report::new(vec![
        Check::ok("kvm_device", "/dev/kvm is usable"),
        Check::warn("kvm_speed", "slow", "use hardware virtualization"),
    ]);
    assert_eq!(report.status, Status::Warn, "the worst of the checks");
    check(&[report]);
    check(&[mcp::tools::info::contract(&mcp::Grants::default())]);
    let image = |manifest: Option<Value>| -> ImageInfo {
        record(json!({
            "name": "minimal",
            "kernel": "/s/images/minimal/vmlinux",
            "rootfs": "/s/images/minimal/rootfs.ext4",
            "kernel_bytes": 1,
            "rootfs_bytes": 2,
            "imported_at_ms": 3,
            "source": "/cache/current",
            "manifest": manifest,
        }))
    };
    check(&[image(None), image(Some(json!({"packages": ["busybox"]})))]);
    check(&[ImageListResult {
        images: vec![
            ImageEntry {
                image: image(None),
                used_by: vec![],
            },
            ImageEntry {
                image: image(Some(json!(1))),
                used_by: vec!["dev".into()],
            },
        ],
    }]);
}
