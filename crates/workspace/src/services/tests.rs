//! The services' steps against a recording collection.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::*;
use base::store::spec::services::parse_flag;

/// A collection that records what is asked of it; `fail` names a
/// companion whose create or start fails.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    specs: Mutex<BTreeMap<String, WorkspaceSpec>>,
    fail: Option<String>,
    forwards: Mutex<Vec<Forward>>,
}

impl Recorder {
    fn failing(name: &str) -> Self {
        Self {
            fail: Some(name.to_owned()),
            ..Self::default()
        }
    }

    fn log(&self, what: String) {
        self.calls.lock().unwrap().push(what);
    }

    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn check(&self, name: &str) -> Result<()> {
        match &self.fail {
            Some(f) if name.starts_with(f.as_str()) => {
                Err(Error::InvalidInput(format!("{name} would not")))
            }
            _ => Ok(()),
        }
    }
}

impl ServiceHost for Recorder {
    fn create_companion(&self, name: &str, spec: WorkspaceSpec) -> Result<()> {
        self.check(name)?;
        self.log(format!("create {name}"));
        self.specs.lock().unwrap().insert(name.to_owned(), spec);
        Ok(())
    }

    fn record_of(&self, name: &str) -> Result<Meta> {
        let specs = self.specs.lock().unwrap();
        let spec = specs
            .get(name)
            .ok_or_else(|| Error::WorkspaceNotFound(name.to_owned()))?;
        Ok(Meta::created(name, spec.clone(), true))
    }

    fn service_defaults(&self, image: &str) -> ImageDefaults {
        ImageDefaults {
            command: (image == "redis").then(|| vec!["redis-server".to_owned()]),
            mem_mib: (image == "redis").then_some(512),
            ..ImageDefaults::default()
        }
    }

    fn halt_companion(&self, name: &str) -> Result<()> {
        self.log(format!("halt {name}"));
        Ok(())
    }

    fn halt_served(&self, name: &str) -> Result<()> {
        self.log(format!("halt workspace {name}"));
        Ok(())
    }

    fn delete_companion(&self, name: &str) -> Result<()> {
        self.log(format!("delete {name}"));
        Ok(())
    }

    async fn start_companion(
        &self,
        name: &str,
        owner: Option<Owner>,
        command: Vec<String>,
    ) -> Result<()> {
        self.check(name)?;
        self.log(format!("start {name} {owner:?} {}", command.join(" ")));
        Ok(())
    }

    async fn give_forwards(&self, name: &str, forwards: Vec<Forward>) -> Result<()> {
        self.log(format!("forward {name}"));
        *self.forwards.lock().unwrap() = forwards;
        Ok(())
    }
}

fn workspace_spec(flags: &[&str]) -> WorkspaceSpec {
    WorkspaceSpec {
        services: flags.iter().map(|f| parse_flag(f).unwrap()).collect(),
        agent: Some("alice".into()),
        ..WorkspaceSpec::default()
    }
}

#[test]
fn companions_are_made_with_no_network_serving_their_workspace() {
    let host = Recorder::default();
    let spec = workspace_spec(&[
        "db=redis,port=6379",
        "web=test-1,port=80,port=443,env=A=1,cmd=httpd",
    ]);
    create_all(&host, "dev", &spec).unwrap();
    let specs = host.specs.lock().unwrap();
    let db = &specs[&companion_name("dev", "db")];
    assert_eq!(db.network, "none");
    assert_eq!(db.mem_mib, 512, "the image's size");
    assert_eq!(db.service_ports, [6379]);
    assert_eq!(db.agent.as_deref(), Some("alice"));
    let serving = db.serving.as_ref().unwrap();
    assert_eq!((serving.workspace.as_str(), serving.index), ("dev", 0));
    let web = &specs[&companion_name("dev", "web")];
    assert_eq!(web.serving.as_ref().unwrap().index, 1);
    assert_eq!(web.env["A"], "1");
    assert_eq!(web.service_ports, [80, 443]);
    for spec in specs.values() {
        spec.validate().unwrap();
    }
}

#[test]
fn a_failed_create_deletes_what_it_made_and_names_the_service() {
    let host = Recorder::failing("web-");
    let spec = workspace_spec(&["db=redis,port=6379", "web=test-1,port=80,cmd=httpd"]);
    let e = create_all(&host, "dev", &spec).unwrap_err();
    assert!(
        matches!(&e, Error::Service { service, .. } if service == "web"),
        "{e}"
    );
    let db = companion_name("dev", "db");
    assert_eq!(
        host.calls(),
        [format!("create {db}"), format!("delete {db}")]
    );
    // An image without a command, and none given: refused before any create.
    let host = Recorder::default();
    let e = create_all(&host, "dev", &workspace_spec(&["web=test-1,port=80"])).unwrap_err();
    assert!(e.full_message().contains("names no command"), "{e}");
    assert!(host.calls().is_empty());
}

#[tokio::test]
async fn a_start_starts_each_service_then_gives_the_guest_their_names() {
    let host = Recorder::default();
    let spec = workspace_spec(&["db=redis,port=6379", "web=test-1,port=80,cmd=httpd -f"]);
    create_all(&host, "dev", &spec).unwrap();
    // The record's name is the VMM's to write: the handle's is used.
    let meta = Meta::created("forged", spec, true);
    host.calls.lock().unwrap().clear();
    start_all(&host, "dev", &meta).await.unwrap();
    let calls = host.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(
        calls[0].starts_with(&format!("start {}", companion_name("dev", "db"))),
        "{calls:?}"
    );
    assert!(calls[0].ends_with("redis-server"), "{calls:?}");
    assert!(calls[1].ends_with("sh -c httpd -f"), "{calls:?}");
    assert_eq!(calls[2], "forward dev");
    let forwards = host.forwards.lock().unwrap();
    let seen: Vec<_> = forwards
        .iter()
        .map(|f| (f.name.as_str(), f.addr.to_string(), f.port, f.vsock_port))
        .collect();
    assert_eq!(
        seen,
        [
            ("db", "127.0.1.2".to_owned(), 6379, 50_000),
            ("web", "127.0.1.3".to_owned(), 80, 50_008)
        ]
    );
}

#[tokio::test]
async fn a_service_that_does_not_start_stops_the_others_and_is_named() {
    let host = Recorder::failing("web-");
    let spec = workspace_spec(&["db=redis,port=6379", "web=test-1,port=80,cmd=httpd"]);
    let meta = Meta::created("dev", spec, true);
    let e = start_all(&host, "dev", &meta).await.unwrap_err();
    assert!(
        matches!(&e, Error::Service { service, .. } if service == "web"),
        "{e}"
    );
    let calls = host.calls();
    // The missing companion of `db` (a fork's, say) was made and started;
    // `web`'s could not be made: both halted, and the workspace too.
    let db = companion_name("dev", "db");
    assert!(calls.contains(&format!("create {db}")), "{calls:?}");
    assert!(calls.contains(&format!("halt {db}")), "{calls:?}");
    assert!(
        calls.contains(&"halt workspace dev".to_owned()),
        "{calls:?}"
    );
    assert!(!calls.iter().any(|c| c.starts_with("forward")), "{calls:?}");
}

#[test]
fn a_delete_tries_every_companion_and_inspect_shows_their_states() {
    let host = Recorder::default();
    let spec = workspace_spec(&["db=redis,port=6379", "web=test-1,port=80,cmd=httpd"]);
    create_all(&host, "dev", &spec).unwrap();
    let meta = Meta::created("dev", spec.clone(), true);
    let shown = infos(&host, "dev", &meta.spec);
    assert_eq!(shown[0].state, "stopped");
    assert_eq!(shown[1].address.to_string(), "127.0.1.3");
    host.specs.lock().unwrap().clear();
    assert_eq!(infos(&host, "dev", &meta.spec)[0].state, "missing");
    delete_all(&host, "dev", &spec).unwrap();
    let deletes = host
        .calls()
        .iter()
        .filter(|c| c.starts_with("delete"))
        .count();
    assert_eq!(deletes, 2);
}
