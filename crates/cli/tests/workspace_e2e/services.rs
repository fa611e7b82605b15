//! Services: a sidecar in a microVM of its own, reached from its
//! workspace's guest by name, started, stopped and deleted with it.

use std::time::{Duration, Instant};

use super::{can_boot, home, start};

/// busybox's httpd serving a page its command writes, after a line the
/// service's logs show, and a CGI script `set?VALUE` that keeps VALUE in
/// `/srv/v` (the service's state, which snapshots carry).
const WEB: &str = concat!(
    "web=minimal,port=8080,cmd=echo serving; mkdir -p /srv/cgi-bin",
    " && echo hello-from-web > /srv/index.html",
    " && printf '#!/bin/sh\\necho \"$QUERY_STRING\" > /srv/v\\necho Content-Type: text/plain\\necho\\necho set\\n' > /srv/cgi-bin/set",
    " && chmod +x /srv/cgi-bin/set && exec busybox httpd -f -p 8080 -h /srv"
);

/// A second service on another port: each has its own address and route.
const API: &str = "api=minimal,port=9090,cmd=mkdir -p /w && echo from-api > /w/index.html && exec busybox httpd -f -p 9090 -h /w";

/// `wget` of `url` from workspace `dev`'s guest, tried for up to 60 s (the
/// service's command may still be starting its server).
fn fetch(cli: &testkit::cli::CliHome, url: &str) -> String {
    fetch_in(cli, "dev", url)
}

/// `wget` of `url` from workspace `workspace`'s guest, as [`fetch`].
fn fetch_in(cli: &testkit::cli::CliHome, workspace: &str, url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let run = cli.run(&["exec", workspace, "--", "wget", "-qO-", url]);
        if run.status == 0 || Instant::now() > deadline {
            assert_eq!(run.status, 0, "{}", run.stderr);
            return run.stdout;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The state both services are in (they go together).
fn service_state(cli: &testkit::cli::CliHome) -> String {
    let info = cli.ok_json(&["inspect", "dev", "--json"]);
    assert_eq!(info["services"][0]["name"], "web", "{info}");
    assert_eq!(info["services"][1]["name"], "api", "{info}");
    let state = &info["services"][0]["state"];
    assert_eq!(state, &info["services"][1]["state"], "{info}");
    state.as_str().unwrap().to_owned()
}

#[test]
fn a_service_is_reached_by_name_and_goes_with_its_workspace() {
    let test = "a_service_is_reached_by_name_and_goes_with_its_workspace";
    if !can_boot(test) {
        return;
    }
    let cli = home(test);
    // Bad input changes nothing.
    for (flag, code) in [
        ("web", "INVALID_INPUT"),
        ("web=no-such-image,port=80,cmd=true", "NOT_FOUND"),
        ("localhost=minimal,port=80,cmd=true", "INVALID_INPUT"),
    ] {
        let refused = cli.run(&["create", "dev", "--service", flag, "--json"]);
        assert_eq!(refused.error_code(), code, "{flag}: {}", refused.stderr);
    }
    let minimal_without_command = cli.run(&["create", "dev", "--service", "web=minimal", "--json"]);
    assert_eq!(minimal_without_command.error_code(), "INVALID_INPUT");
    assert!(
        minimal_without_command.stdout.contains("web"),
        "{}",
        minimal_without_command.stdout
    );
    assert_eq!(
        cli.ok_json(&["list", "--namespace", "*", "--json"]),
        serde_json::json!([])
    );

    let made = cli.ok_json(&[
        "create",
        "dev",
        "--service",
        WEB,
        "--service",
        API,
        "--json",
    ]);
    assert_eq!(made["spec"]["services"][0]["ports"][0], 8080, "{made}");
    // The companion is no one's to list or name.
    assert_eq!(
        cli.ok_json(&["list", "--json"]).as_array().unwrap().len(),
        1
    );
    let reserved = cli.run(&["list", "--namespace", "microagent-svc", "--json"]);
    assert_eq!(
        reserved.error_code(),
        "INVALID_INPUT",
        "{}",
        reserved.stderr
    );
    assert_eq!(service_state(&cli), "stopped");

    start(&cli, "dev");
    assert_eq!(service_state(&cli), "running");
    assert_eq!(fetch(&cli, "http://web:8080/"), "hello-from-web\n");
    assert_eq!(fetch(&cli, "http://api:9090/"), "from-api\n");
    let hosts = cli.run(&["exec", "dev", "--", "cat", "/etc/hosts"]);
    assert!(hosts.stdout.contains("127.0.1.2\tweb"), "{}", hosts.stdout);
    assert!(hosts.stdout.contains("127.0.1.3\tapi"), "{}", hosts.stdout);
    let logs = cli.ok_json(&["logs", "dev", "--service", "web", "--json"]);
    assert!(
        logs["stdout"].as_str().unwrap().contains("serving"),
        "{logs}"
    );
    let unknown = cli.run(&["logs", "dev", "--service", "db", "--json"]);
    assert_eq!(unknown.error_code(), "NOT_FOUND", "{}", unknown.stderr);

    snapshots_carry_the_services(&cli);

    // Stopped with it (started with it again is the first start's path:
    // the companions were made stopped at `create`).
    cli.ok_json(&["stop", "dev", "--json"]);
    assert_eq!(service_state(&cli), "stopped");

    // Deleted with it: nothing of either is left.
    cli.ok_json(&["delete", "dev", "--force", "--yes", "--json"]);
    let left: Vec<_> = std::fs::read_dir(cli.home().join("workspaces"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A snapshot of running `dev` holds its services' machines: a restore in
/// place takes the service's state back to it, and a fork from it has
/// companions of its own in that state.
fn snapshots_carry_the_services(cli: &testkit::cli::CliHome) {
    const SET_ONE: &str = "http://web:8080/cgi-bin/set?one";
    const VALUE: &str = "http://web:8080/v";
    assert_eq!(fetch(cli, SET_ONE), "set\n");
    let taken = cli.ok_json(&["snapshot", "take", "dev", "s1", "--json"]);
    let parts: Vec<_> = taken["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["service"].as_str().unwrap(), p["has_memory"].as_bool()))
        .collect();
    assert_eq!(parts, [("web", Some(true)), ("api", Some(true))], "{taken}");
    // The services run on after the take.
    assert_eq!(fetch(cli, "http://web:8080/cgi-bin/set?two"), "set\n");
    assert_eq!(fetch(cli, VALUE), "two\n");

    // In place: the service's state is the snapshot's again.
    let restored = cli.ok_json(&["snapshot", "restore", "s1", "--force", "--json"]);
    assert_eq!(restored["state"], "running", "{restored}");
    assert_eq!(service_state(cli), "running");
    assert_eq!(fetch(cli, VALUE), "one\n");
    assert_eq!(fetch(cli, "http://api:9090/"), "from-api\n");

    // A fork of it: its own services, in the snapshot's state, apart from
    // the original's.
    cli.ok_json(&["fork", "dev", "f1", "--snapshot", "s1", "--json"]);
    let info = cli.ok_json(&["inspect", "f1", "--json"]);
    let companion = info["services"][0]["companion"].as_str().unwrap();
    assert!(companion.starts_with("web-"), "{info}");
    assert_ne!(
        companion,
        cli.ok_json(&["inspect", "dev", "--json"])["services"][0]["companion"],
        "{info}"
    );
    assert_eq!(info["services"][0]["state"], "running", "{info}");
    assert_eq!(fetch_in(cli, "f1", VALUE), "one\n");
    assert_eq!(
        fetch_in(cli, "f1", "http://web:8080/cgi-bin/set?three"),
        "set\n"
    );
    assert_eq!(fetch(cli, VALUE), "one\n");
    cli.ok_json(&["delete", "f1", "--force", "--yes", "--json"]);
    cli.ok_json(&["snapshot", "rm", "s1", "--json"]);

    // A fork of the running workspace takes its services as they are.
    assert_eq!(fetch(cli, "http://web:8080/cgi-bin/set?four"), "set\n");
    cli.ok_json(&["fork", "dev", "f2", "--json"]);
    assert_eq!(fetch_in(cli, "f2", VALUE), "four\n");
    cli.ok_json(&["delete", "f2", "--force", "--yes", "--json"]);
}
