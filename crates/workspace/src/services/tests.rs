//! The services' steps against a recording collection.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use super::*;
use base::code::ErrorCode;
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
        how: CompanionStart,
    ) -> Result<()> {
        self.check(name)?;
        match how {
            CompanionStart::Run(command) => {
                self.log(format!("start {name} {owner:?} {}", command.join(" ")))
            }
            CompanionStart::Resume(part) => {
                self.log(format!("resume {name} {owner:?} {}", part.display()))
            }
        }
        Ok(())
    }

    fn pause_companion(&self, name: &str, pause: bool) -> Result<bool> {
        self.log(format!("pause {name} {pause}"));
        Ok(self.specs.lock().unwrap().contains_key(name))
    }

    fn snapshot_companion(
        &self,
        name: &str,
        service: &str,
        into: &Path,
    ) -> Result<ServiceSnapshot> {
        self.check(name)?;
        if !self.specs.lock().unwrap().contains_key(name) {
            return Err(Error::WorkspaceNotFound(name.to_owned()));
        }
        std::fs::create_dir(into).unwrap();
        self.log(format!("snapshot {name}"));
        Ok(ServiceSnapshot::new(service, true))
    }

    fn load_companion_disk(&self, name: &str, part: &Path) -> Result<()> {
        self.log(format!("load {name} {}", part.display()));
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
fn a_failed_create_stops_there_and_names_the_service() {
    let host = Recorder::failing("web-");
    let spec = workspace_spec(&[
        "db=redis,port=6379",
        "web=test-1,port=80,cmd=httpd",
        "late=redis,port=1",
    ]);
    let e = create_all(&host, "dev", &spec).unwrap_err();
    assert!(
        matches!(&e, Error::Service { service, .. } if service == "web"),
        "{e}"
    );
    let db = companion_name("dev", "db");
    assert_eq!(host.calls(), [format!("create {db}")]);
    // The workspace's delete (the create's rollback) tries every one.
    delete_all(&host, "dev", &spec).unwrap();
    let deletes = host
        .calls()
        .iter()
        .filter(|c| c.starts_with("delete"))
        .count();
    assert_eq!(deletes, 3);
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
    start_all(&host, "dev", &meta, None).await.unwrap();
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
    let e = start_all(&host, "dev", &meta, None).await.unwrap_err();
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

/// A fresh directory for a snapshot's files.
fn scratch_dir() -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ma-services-{}", base::host::settings::unique_id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_snapshot_pauses_every_service_writes_each_part_and_resumes_them() {
    let host = Recorder::default();
    let spec = workspace_spec(&[
        "db=redis,port=6379",
        "web=test-1,port=80,cmd=httpd",
        "gone=redis,port=1",
    ]);
    create_all(&host, "dev", &spec).unwrap();
    let gone = companion_name("dev", "gone");
    host.specs.lock().unwrap().remove(&gone);
    host.calls.lock().unwrap().clear();
    let dir = scratch_dir();
    let (written, parts) = snapshot_all(&host, "dev", &spec, &dir, || {
        host.log("write dev".to_owned());
        // What the workspace's VMM might leave where the parts go.
        std::fs::create_dir_all(dir.join("services/db/planted")).unwrap();
        Ok(7)
    })
    .unwrap();
    assert_eq!(written, 7);
    let (db, web) = (companion_name("dev", "db"), companion_name("dev", "web"));
    assert_eq!(
        host.calls(),
        [
            format!("pause {db} true"),
            format!("pause {web} true"),
            format!("pause {gone} true"),
            "write dev".to_owned(),
            format!("snapshot {db}"),
            format!("snapshot {web}"),
            // Every one, whether this take paused it or not.
            format!("pause {db} false"),
            format!("pause {web} false"),
            format!("pause {gone} false"),
        ]
    );
    // A missing companion has no part; what was planted is gone.
    let names: Vec<_> = parts.iter().map(|p| p.service.as_str()).collect();
    assert_eq!(names, ["db", "web"]);
    assert!(!dir.join("services/db/planted").exists());

    // A failure of the workspace's own write still resumes the services.
    host.calls.lock().unwrap().clear();
    let e = snapshot_all(&host, "dev", &spec, &scratch_dir(), || -> Result<()> {
        Err(Error::InvalidInput("no".into()))
    })
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidInput);
    let calls = host.calls();
    assert!(calls.contains(&format!("pause {db} false")), "{calls:?}");
    assert!(calls.contains(&format!("pause {web} false")), "{calls:?}");
    // A service whose part fails is named, and the others resume.
    let host = Recorder::failing("web-");
    host.specs.lock().unwrap().extend([
        (db.clone(), WorkspaceSpec::default()),
        (web.clone(), WorkspaceSpec::default()),
    ]);
    let e = snapshot_all(&host, "dev", &spec, &scratch_dir(), || Ok(())).unwrap_err();
    assert!(
        matches!(&e, Error::Service { service, .. } if service == "web"),
        "{e}"
    );
    assert!(host.calls().contains(&format!("pause {db} false")));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_start_from_a_snapshot_resumes_what_ran_and_runs_the_rest() {
    let host = Recorder::default();
    let spec = workspace_spec(&[
        "db=redis,port=6379",
        "web=test-1,port=80,cmd=httpd",
        "new=redis,port=1",
    ]);
    let dir = scratch_dir();
    // db ran, web was stopped (a disk only), new has no part in the record.
    let parts = [
        ServiceSnapshot::new("db", true),
        ServiceSnapshot::new("web", false),
    ];
    // What the record does not say is never used: a machine state planted
    // in web's disk-only part, a part planted for new.
    for service in ["db", "web", "new"] {
        let part = snapshot::part_dir(&dir, service);
        std::fs::create_dir_all(&part).unwrap();
        std::fs::write(vmm_core::snapshot::SnapshotFiles::new(&part).state(), b"x").unwrap();
    }
    let from = ServiceOrigin {
        dir: &dir,
        parts: &parts,
    };
    // A fork's: no companion exists yet.
    let meta = Meta::created("dev", spec.clone(), true);
    start_all(&host, "dev", &meta, Some(from)).await.unwrap();
    let calls = host.calls();
    let (db, web, new) = (
        companion_name("dev", "db"),
        companion_name("dev", "web"),
        companion_name("dev", "new"),
    );
    for made in [&db, &web, &new] {
        assert!(calls.contains(&format!("create {made}")), "{calls:?}");
    }
    let (db_part, web_part) = (
        snapshot::part_dir(&dir, "db"),
        snapshot::part_dir(&dir, "web"),
    );
    for expected in [
        format!("load {db} {}", db_part.display()),
        format!("resume {db} None {}", db_part.display()),
        format!("load {web} {}", web_part.display()),
        format!("start {web} None sh -c httpd"),
        format!("start {new} None redis-server"),
    ] {
        assert!(calls.contains(&expected), "{expected}: {calls:?}");
    }
    assert!(!calls.iter().any(|c| c.starts_with(&format!("load {new}"))));
    assert!(!calls
        .iter()
        .any(|c| c.starts_with(&format!("resume {web}"))));

    // A restore in place of a snapshot without memory: disks only.
    host.calls.lock().unwrap().clear();
    restore_disks(&host, "dev", &spec, from).unwrap();
    assert_eq!(
        host.calls(),
        [
            format!("load {db} {}", db_part.display()),
            format!("load {web} {}", web_part.display()),
        ]
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_part_is_used_only_as_its_record_says() {
    let dir = scratch_dir();
    let part = snapshot::part_dir(&dir, "db");
    std::fs::create_dir_all(&part).unwrap();
    let disk = vmm_core::snapshot::SnapshotFiles::new(&part).disk(base::vmm::seal::WORKSPACE_DISK);
    std::fs::write(&disk, vec![7u8; 8192]).unwrap();
    let mut record = ServiceSnapshot::new("db", false);
    record.disk_sha256 = Some(base::vmm::seal::Sealed::Disk.digest(&part).unwrap());
    let check = |parts: &[ServiceSnapshot]| ServiceOrigin { dir: &dir, parts }.check();
    check(std::slice::from_ref(&record)).unwrap();
    // Changed after it was taken.
    std::fs::write(&disk, vec![8u8; 8192]).unwrap();
    let changed = check(std::slice::from_ref(&record)).unwrap_err();
    assert!(
        changed.contains("service `db`") && changed.contains("digest"),
        "{changed}"
    );
    // A record claiming memory it does not have.
    record.disk_sha256 = Some(base::vmm::seal::Sealed::Disk.digest(&part).unwrap());
    record.has_memory = true;
    assert!(check(std::slice::from_ref(&record)).is_err());
    // A name no service could have, which would leave the directory.
    let escaping = ServiceSnapshot::new("../db", false);
    let refused = check(&[escaping]).unwrap_err();
    assert!(refused.contains("name"), "{refused}");
    let _ = std::fs::remove_dir_all(dir);
}
