//! Networks end to end, inside network namespaces each test makes (no
//! traffic leaves them): a "host" namespace where the workspaces run (and
//! where `microagent network setup` applies its bridges, nftables table
//! and resolvers for tap networks), joined by a veth pair to a "world"
//! namespace holding two web servers, the upstream DNS server that knows
//! their names, and a server on the cloud metadata address. Tap networks:
//! egress `allowlist` reaches the allowed server by name and nothing
//! else, `none` reaches nothing, `all` reaches both; a fork on the same
//! network takes an address of its own. The `user` network: each VMM's
//! filter enforces the policy with no host setup. Needs root (namespaces,
//! CAP_NET_ADMIN), iproute2, nftables, dnsmasq and busybox.

use std::process::Command;

use testkit::cli::CliHome;

// The test's "internet" is in 198.18/15 (benchmarking), an address range
// a public name may answer: dnsmasq's --stop-dns-rebind drops answers in
// the TEST-NETs (198.51.100/24 and the like) as it does private ones.
const WORLD_ALLOWED: &str = "198.18.0.10";
const WORLD_DENIED: &str = "198.18.0.20";
const WORLD_DNS: &str = "198.18.0.53";
const WORLD_GATEWAY: &str = "198.18.0.1";
const METADATA: &str = "169.254.169.254";
/// A server on the host namespace's loopback (what `host:PORT` opens).
const HOST_PORT: u16 = 8000;

fn sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why this host cannot run the test, if it cannot.
fn preconditions() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root (network namespaces, CAP_NET_ADMIN)".into());
    }
    for tool in ["ip", "nft", "dnsmasq", "busybox"] {
        if workspace::host::settings::host_tool(tool).is_none() && which(tool).is_none() {
            return Err(format!(
                "{tool} is not installed (apt-get install iproute2 nftables dnsmasq-base busybox-static)"
            ));
        }
    }
    Ok(())
}

fn which(tool: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.exists())
    })
}

/// The two namespaces, the world's servers, and the host namespace's
/// resolv.conf; removed (servers killed) on drop.
struct Namespaces {
    host: String,
    world: String,
    dir: std::path::PathBuf,
}

impl Namespaces {
    /// Namespaces of their own for each `tag` (tests run at once).
    fn make(tag: &str) -> Result<Self, String> {
        let id = std::process::id();
        let ns = Self {
            host: format!("mah{tag}{id}"),
            world: format!("maw{tag}{id}"),
            dir: std::path::PathBuf::from(format!("/tmp/ma-netns-{tag}{id}")),
        };
        ns.build()?;
        Ok(ns)
    }

    fn build(&self) -> Result<(), String> {
        let (h, w) = (self.host.as_str(), self.world.as_str());
        for n in [h, w] {
            sh(&["ip", "netns", "add", n])?;
            sh(&["ip", "-n", n, "link", "set", "lo", "up"])?;
        }
        sh(&[
            "ip", "link", "add", "vwh", "netns", h, "type", "veth", "peer", "name", "vww", "netns",
            w,
        ])?;
        sh(&[
            "ip",
            "-n",
            h,
            "addr",
            "add",
            &format!("{WORLD_GATEWAY}/24"),
            "dev",
            "vwh",
        ])?;
        sh(&["ip", "-n", h, "link", "set", "vwh", "up"])?;
        for addr in [WORLD_ALLOWED, WORLD_DENIED, WORLD_DNS] {
            sh(&[
                "ip",
                "-n",
                w,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "vww",
            ])?;
        }
        sh(&["ip", "-n", w, "link", "set", "vww", "up"])?;
        sh(&[
            "ip",
            "-n",
            w,
            "route",
            "add",
            "default",
            "via",
            WORLD_GATEWAY,
        ])?;
        // The world's DNS knows both servers by name.
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let pid = self.dir.join("world-dns.pid");
        sh(&[
            "ip",
            "netns",
            "exec",
            w,
            "dnsmasq",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            &format!("--listen-address={WORLD_DNS}"),
            &format!("--pid-file={}", pid.display()),
            &format!("--address=/allowed.test/{WORLD_ALLOWED}"),
            &format!("--address=/denied.test/{WORLD_DENIED}"),
            // A name whose owner points it at the metadata address (DNS
            // rebinding): allowing the name must not open the address.
            &format!("--address=/rebind.test/{METADATA}"),
        ])?;
        // The cloud metadata address, in the world: guests on the `user`
        // network reach it through the host namespace's route unless the
        // policy refuses it.
        sh(&[
            "ip",
            "-n",
            w,
            "addr",
            "add",
            &format!("{METADATA}/32"),
            "dev",
            "vww",
        ])?;
        sh(&[
            "ip",
            "-n",
            h,
            "route",
            "add",
            &format!("{METADATA}/32"),
            "dev",
            "vwh",
        ])?;
        for (addr, body) in [
            (WORLD_ALLOWED, "allowed"),
            (WORLD_DENIED, "denied"),
            (METADATA, "metadata"),
        ] {
            let www = self.dir.join(body);
            std::fs::create_dir_all(&www).map_err(|e| e.to_string())?;
            std::fs::write(www.join("index.html"), format!("{body}\n"))
                .map_err(|e| e.to_string())?;
            // busybox httpd daemonizes; the drop kills it with the rest
            // of the namespace's processes.
            sh(&[
                "ip",
                "netns",
                "exec",
                w,
                "busybox",
                "httpd",
                "-p",
                &format!("{addr}:80"),
                "-h",
                &www.display().to_string(),
            ])?;
        }
        // `ip netns exec` puts this over /etc/resolv.conf in the host
        // namespace: the "host's resolver" is the world's DNS.
        let etc = format!("/etc/netns/{h}");
        std::fs::create_dir_all(&etc).map_err(|e| e.to_string())?;
        std::fs::write(
            format!("{etc}/resolv.conf"),
            format!("nameserver {WORLD_DNS}\n"),
        )
        .map_err(|e| e.to_string())?;
        Ok(())
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Every process still in either namespace: the world's servers, and
        // resolvers a failed test left behind.
        for ns in [&self.host, &self.world] {
            if let Ok(pids) = sh(&["ip", "netns", "pids", ns]) {
                for pid in pids.split_whitespace() {
                    let _ = sh(&["kill", "-9", pid]);
                }
            }
            let _ = sh(&["ip", "netns", "del", ns]);
        }
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.host));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `wget -qO- URL` in workspace `ws`: the page, or the error.
fn fetch(cli: &CliHome, ws: &str, url: &str) -> Result<String, String> {
    let run = cli.run(&["exec", ws, "--", "wget", "-qO-", url]);
    if run.status == 0 {
        Ok(run.stdout)
    } else {
        Err(format!("exit {}: {}", run.status, run.stderr.trim()))
    }
}

fn apply(cli: &CliHome, what: &str) {
    let preview = cli.ok_json(&["network", what, "--json"]);
    assert_eq!(preview["applied"], false, "{preview}");
    let token = preview["token"].as_str().expect("a token").to_owned();
    let applied = cli.ok_json(&["network", what, "--confirm", &token, "--json"]);
    assert_eq!(applied["applied"], true, "{applied}");
    let again = cli.ok_json(&["network", what, "--json"]);
    assert!(
        again["plan"]["steps"].as_array().is_some_and(Vec::is_empty),
        "{what} applied, so nothing is left to do: {again}"
    );
}

#[test]
fn tap_networks_enforce_their_egress_policy() {
    let test = "tap_networks_enforce_their_egress_policy";
    if testkit::require(test, testkit::guest_assets()).is_none()
        || testkit::require(test, testkit::workspace_image("minimal")).is_none()
        || testkit::require(test, testkit::host_tool("mkfs.ext4")).is_none()
        || testkit::require(test, preconditions()).is_none()
    {
        return;
    }
    let ns = Namespaces::make("t").expect("making the test's network namespaces");
    let cli = CliHome::new(env!("CARGO_BIN_EXE_microagent"), test).in_netns(&ns.host);
    let metadata_port = format!("{METADATA}:80");
    for (name, extra) in [
        ("open", vec!["--egress", "all"]),
        ("shut", vec!["--egress", "none"]),
        (
            "some",
            vec![
                "--egress",
                "allowlist",
                "--allow",
                "allowed.test",
                "--allow",
                "rebind.test",
                "--allow",
                &metadata_port,
            ],
        ),
        ("mates", vec!["--egress", "all", "--allow-peers"]),
    ] {
        let mut args = vec!["network", "create", name, "--backend", "tap", "--json"];
        args.extend(extra);
        cli.ok_json(&args);
    }
    // Before the host setup a tap workspace cannot start, and says why.
    cli.ok_json(&["create", "a", "--network", "some", "--json"]);
    let early = cli.run(&["start", "a", "--json"]);
    assert_ne!(early.status, 0);
    assert_eq!(early.error_code(), "HOST_UNSUPPORTED", "{}", early.stdout);
    apply(&cli, "setup");

    // allowlist: the allowed name only.
    cli.ok(&["start", "a"]);
    let info = cli.ok_json(&["inspect", "a", "--json"]);
    assert_eq!(info["network"]["name"], "some", "{info}");
    assert_eq!(info["network"]["egress"], "allowlist");
    assert_eq!(info["network"]["guest"], info["spec"]["address"]);
    assert_eq!(info["network"]["gateway"], "10.89.2.1");
    assert_eq!(
        fetch(&cli, "a", "http://allowed.test/").unwrap(),
        "allowed\n"
    );
    let refused = fetch(&cli, "a", &format!("http://{WORLD_DENIED}/")).unwrap_err();
    assert!(refused.contains("refused"), "{refused}");
    let unnamed = fetch(&cli, "a", "http://denied.test/").unwrap_err();
    assert!(unnamed.contains("bad address"), "{unnamed}");
    // An allowed name answering a link-local address: the network's
    // resolver drops the answer (--stop-dns-rebind), though a rule opens
    // the address itself.
    let rebound = fetch(&cli, "a", "http://rebind.test/").unwrap_err();
    assert!(rebound.contains("bad address"), "{rebound}");
    // A rule with a port opens that address and port.
    assert_eq!(
        fetch(&cli, "a", &format!("http://{METADATA}/")).unwrap(),
        "metadata\n"
    );

    // none: nothing, by name or address (a warm start: the guest takes
    // its address on another network at restore).
    cli.ok_json(&["create", "b", "--network", "shut", "--json"]);
    cli.ok(&["start", "b"]);
    assert!(fetch(&cli, "b", "http://allowed.test/").is_err());
    assert!(fetch(&cli, "b", &format!("http://{WORLD_ALLOWED}/")).is_err());

    // all: both; a fork on the same network gets an address of its own
    // and reaches them too.
    let c = cli.ok_json(&["create", "c", "--network", "open", "--json"]);
    cli.ok(&["start", "c"]);
    assert_eq!(
        fetch(&cli, "c", "http://allowed.test/").unwrap(),
        "allowed\n"
    );
    assert_eq!(fetch(&cli, "c", "http://denied.test/").unwrap(), "denied\n");
    let fork = cli.ok_json(&["fork", "c", "c2", "--json"]);
    assert_ne!(fork["spec"]["address"], c["spec"]["address"], "{fork}");
    let shown = cli.run(&["exec", "c2", "--", "ip", "-4", "-o", "addr", "show", "eth0"]);
    let want = fork["spec"]["address"].as_str().unwrap();
    assert!(shown.stdout.contains(want), "{} / {want}", shown.stdout);
    assert_eq!(
        fetch(&cli, "c2", "http://denied.test/").unwrap(),
        "denied\n"
    );
    assert_eq!(fetch(&cli, "c", "http://denied.test/").unwrap(), "denied\n");
    // Guests of one network do not reach each other (isolated bridge
    // ports), unless the network allows peers.
    let ping = |from: &str, to: &serde_json::Value| {
        let to = to["spec"]["address"].as_str().unwrap().to_owned();
        cli.run(&["exec", from, "--", "ping", "-c", "1", "-W", "3", &to])
            .status
    };
    assert_ne!(ping("c2", &c), 0, "c2 reached c on an isolated bridge");
    let m1 = cli.ok_json(&["create", "m1", "--network", "mates", "--json"]);
    cli.ok(&["start", "m1"]);
    cli.ok_json(&["fork", "m1", "m2", "--json"]);
    assert_eq!(ping("m2", &m1), 0, "m2 did not reach m1 with --allow-peers");
    // A guest's frames carry its own address and MAC, or go nowhere.
    let gateway = cli.ok_json(&["inspect", "c", "--json"])["network"]["gateway"]
        .as_str()
        .unwrap()
        .to_owned();
    let spoofed = format!("{}.250", gateway.rsplit_once('.').unwrap().0);
    let in_c = |script: &str| cli.run(&["exec", "c", "--", "sh", "-c", script]).status;
    assert_eq!(in_c(&format!("ping -c 1 -W 3 {gateway}")), 0);
    assert_ne!(
        in_c(&format!(
            "ip addr add {spoofed}/24 dev eth0 && ping -c 1 -W 3 -I {spoofed} {gateway}"
        )),
        0,
        "a spoofed source address went through"
    );
    assert_ne!(
        in_c(&format!(
            "ip link set eth0 down && ip link set eth0 address 02:00:00:00:00:99 && \
             ip link set eth0 up && ping -c 1 -W 3 {gateway}"
        )),
        0,
        "a spoofed MAC went through"
    );

    // A network in use stays; teardown removes what setup made.
    let in_use = cli.run(&["network", "rm", "open", "--json"]);
    assert_eq!(in_use.error_code(), "CONFLICT");
    for ws in ["a", "b", "c", "c2", "m1", "m2"] {
        cli.ok(&["delete", ws, "--force", "--yes"]);
    }
    apply(&cli, "teardown");
    let links = sh(&["ip", "-n", &ns.host, "-o", "link", "show"]).unwrap();
    assert!(!links.contains("microagent"), "{links}");
    cli.ok(&["network", "rm", "open"]);
    cli.ok(&["network", "rm", "mates"]);
}

/// The `user` network's policy, enforced by each workspace's VMM with no
/// host setup, in namespaces of its own: by default the world is reachable
/// but not the host namespace's loopback nor the metadata address;
/// `host:PORT` opens one host port; an allowlist reaches allowed names
/// only (other names REFUSED, other resolvers and unnamed addresses
/// refused); a rule added while it runs works at once; refusals show in
/// `network policy` and as events.
#[test]
fn the_user_network_enforces_egress_without_host_setup() {
    let test = "the_user_network_enforces_egress_without_host_setup";
    if testkit::require(test, testkit::guest_assets()).is_none()
        || testkit::require(test, testkit::workspace_image("minimal")).is_none()
        || testkit::require(test, testkit::host_tool("mkfs.ext4")).is_none()
        || testkit::require(test, preconditions()).is_none()
    {
        return;
    }
    let ns = Namespaces::make("u").expect("making the test's network namespaces");
    let www = ns.dir.join("host-loopback");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("index.html"), "the host\n").unwrap();
    for port in [HOST_PORT, HOST_PORT + 1] {
        sh(&[
            "ip",
            "netns",
            "exec",
            &ns.host,
            "busybox",
            "httpd",
            "-p",
            &format!("127.0.0.1:{port}"),
            "-h",
            &www.display().to_string(),
        ])
        .unwrap();
    }
    let cli = CliHome::new(env!("CARGO_BIN_EXE_microagent"), test).in_netns(&ns.host);
    let host_url = |port: u16| format!("http://host.microagent.internal:{port}/");

    // The default: the world, not the host's loopback, not the metadata
    // service.
    cli.ok_json(&[
        "create",
        "d",
        "--allow",
        &format!("host:{HOST_PORT}"),
        "--json",
    ]);
    cli.ok(&["start", "d"]);
    assert_eq!(fetch(&cli, "d", "http://denied.test/").unwrap(), "denied\n");
    assert_eq!(
        fetch(&cli, "d", &host_url(HOST_PORT)).unwrap(),
        "the host\n"
    );
    let refused = fetch(&cli, "d", &host_url(HOST_PORT + 1)).unwrap_err();
    assert!(refused.contains("refused"), "{refused}");
    let metadata = fetch(&cli, "d", &format!("http://{METADATA}/")).unwrap_err();
    assert!(metadata.contains("refused"), "{metadata}");
    let policy = cli.ok_json(&["network", "policy", "d", "--json"]);
    let denied: Vec<String> = policy["denials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| format!("{}:{}", d["dst"].as_str().unwrap(), d["port"]))
        .collect();
    assert_eq!(
        denied,
        [
            format!("10.0.2.2:{}", HOST_PORT + 1),
            format!("{METADATA}:80")
        ],
        "{policy}"
    );
    // `inspect` shows the same refusals.
    let inspected = cli.ok_json(&["inspect", "d", "--json"]);
    assert_eq!(
        inspected["refused"]["denials"], policy["denials"],
        "{inspected}"
    );
    assert_eq!(inspected["refused"]["denied"], 2, "{inspected}");

    // An allowlist by name.
    cli.ok_json(&[
        "create",
        "a",
        "--egress",
        "allowlist",
        "--allow",
        "allowed.test",
        "--json",
    ]);
    cli.ok(&["start", "a"]);
    assert_eq!(
        fetch(&cli, "a", "http://allowed.test/").unwrap(),
        "allowed\n"
    );
    let unnamed = fetch(&cli, "a", "http://denied.test/").unwrap_err();
    assert!(unnamed.contains("bad address"), "{unnamed}");
    let direct = fetch(&cli, "a", &format!("http://{WORLD_DENIED}/")).unwrap_err();
    assert!(direct.contains("refused"), "{direct}");
    let other = cli.run(&["exec", "a", "--", "nslookup", "denied.test", WORLD_DNS]);
    assert_ne!(
        other.status, 0,
        "another resolver answered: {}",
        other.stdout
    );
    // A rule added while it runs: the next lookup and connection work.
    cli.ok_json(&[
        "network",
        "policy",
        "a",
        "--allow",
        "allowed.test",
        "--allow",
        "denied.test",
        "--json",
    ]);
    assert_eq!(fetch(&cli, "a", "http://denied.test/").unwrap(), "denied\n");
    // An allowed name that answers the metadata address (DNS rebinding):
    // the answer admits nothing guarded.
    cli.ok_json(&[
        "network",
        "policy",
        "a",
        "--allow",
        "allowed.test",
        "--allow",
        "denied.test",
        "--allow",
        "rebind.test",
        "--json",
    ]);
    let rebound = fetch(&cli, "a", "http://rebind.test/").unwrap_err();
    assert!(rebound.contains("refused"), "{rebound}");
    // The VMM writes refusals into events once a second.
    let events = || cli.run(&["events", "a", "--json"]).stdout;
    let recorded = testkit::wait_until(std::time::Duration::from_secs(10), || {
        events().contains("\"name\":\"denied.test\"")
    });
    let log = std::fs::read_to_string(cli.home().join("workspaces/a/vmm.log")).unwrap_or_default();
    assert!(recorded, "{}\nvmm.log:\n{log}", events());
    assert!(events().contains("\"egress_refused\""), "{}", events());
    for ws in ["d", "a"] {
        cli.ok(&["delete", ws, "--force", "--yes"]);
    }
}
