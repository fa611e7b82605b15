//! Snapshots and forks of the running `dev` workspace (part of
//! `life_cycle_exec_files_logs_events`, which boots it).

use std::time::Instant;

use testkit::cli::CliHome;

use crate::events;

/// On the running `dev`: a snapshot, two forks of it that see the state
/// of then (and not what came after) and not each other's writes, a fork of
/// the live workspace, a damaged snapshot refused. Forks restore in about a
/// second, so this costs no boot.
pub(crate) fn snapshots_and_forks(cli: &CliHome, url: &str) {
    let sh = |ws: &str, line: &str| cli.run(&["exec", ws, "--shell", "--", line]);
    assert_eq!(sh("dev", "echo A > /root/a").status, 0);
    let taken = cli.ok_json(&["snapshot", "take", "dev", "s1", "--json"]);
    assert_eq!(taken["has_memory"], true, "{taken}");
    // Guest memory and disks are this user's alone.
    let mode = |p: &str| {
        use std::os::unix::fs::PermissionsExt;
        let path = cli.home().join(p);
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode("snapshots/s1"), 0o700);
    // Root's VMMs run as their own account, whose group may only pass
    // through `snapshots/` to the snapshot being written.
    // SAFETY: geteuid takes nothing.
    let vmm_account = (unsafe { libc::geteuid() } == 0)
        .then(|| workspace::vmm::user::lookup(workspace::vmm::user::DEFAULT_VMM_USER))
        .flatten();
    match vmm_account {
        Some(account) => {
            use std::os::unix::fs::MetadataExt;
            let gid = std::fs::metadata(cli.home().join("snapshots"))
                .unwrap()
                .gid();
            assert_eq!((mode("snapshots"), gid), (0o710, account.gid));
        }
        None => assert_eq!(mode("snapshots"), 0o700),
    }
    for file in ["vm.state", "memory.raw", "disk-1.raw"] {
        assert_eq!(mode(&format!("snapshots/s1/{file}")), 0o600, "{file}");
    }
    other_users_see_nothing(cli);
    assert_eq!(
        cli.run(&["snapshot", "take", "dev", "s1", "--json"])
            .error_code(),
        "CONFLICT"
    );
    assert_eq!(sh("dev", "echo B > /root/b").status, 0);
    // With a standby kept (issue 59): f1's restore starts a VMM process
    // and a standby for the next; f2's restore is handed to that standby.
    let config = cli.home().join("config.json");
    std::fs::write(&config, r#"{"standby": {"count": 1}}"#).unwrap();
    for fork in ["f1", "f2"] {
        let began = Instant::now();
        let forked = cli.ok_json(&["fork", "dev", fork, "--snapshot", "s1", "--json"]);
        assert_eq!(forked["state"], "running");
        assert_eq!(
            forked["spec"]["ports"],
            serde_json::json!([]),
            "forks publish no ports"
        );
        eprintln!("{fork} forked in {:.1} s", began.elapsed().as_secs_f64());
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while workspace::vmm::standby::waiting_all(cli.home()) == 0 {
            assert!(Instant::now() < deadline, "no standby started after {fork}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let vmm_log = |ws: &str| {
        std::fs::read_to_string(cli.home().join(format!("workspaces/{ws}/vmm.log"))).unwrap()
    };
    assert!(vmm_log("f1").contains("standby=false"), "{}", vmm_log("f1"));
    assert!(vmm_log("f2").contains("standby=true"), "{}", vmm_log("f2"));
    assert!(vmm_log("f2").contains("memory_registered_ahead=true"));
    // The standby was made like f1 (a fork of `dev`, the same network and
    // host rule): f2 took the passt it started ahead, its log moved in
    // (its network is checked below).
    assert!(
        vmm_log("f2").contains("passt: the one started ahead"),
        "{}",
        vmm_log("f2")
    );
    assert!(cli.home().join("workspaces/f2/passt.log").exists());
    // A standby's VMM is confined as any other, in the workspace's own
    // cgroups (the standby's, renamed at the claim).
    crate::confinement::check(cli, "f2");
    let pid = cli.ok_json(&["inspect", "f2", "--json"])["runtime"]["pid"]
        .as_u64()
        .unwrap();
    let in_groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let record =
        std::fs::read_to_string(cli.home().join("workspaces/f2/cgroups")).unwrap_or_default();
    for dir in record.lines() {
        let leaf = std::path::Path::new(dir)
            .file_name()
            .unwrap()
            .to_string_lossy();
        assert!(
            leaf.starts_with("f2-") || leaf.starts_with("microagent-f2-"),
            "{dir}"
        );
        assert!(in_groups.contains(&*leaf), "{dir} not in {in_groups}");
    }
    assert!(!in_groups.contains("standby-"), "{in_groups}");
    // The passt started ahead holds nothing of the standby's but its own
    // socket end: no KVM descriptor, no eventfd of the VM made before it.
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
    let passt = children
        .split_whitespace()
        .next()
        .expect("f2's VMM has a passt");
    let held: Vec<String> = std::fs::read_dir(format!("/proc/{passt}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .collect();
    assert!(
        !held
            .iter()
            .any(|t| t.contains("kvm") || t.contains("eventfd")),
        "{held:?}"
    );
    std::fs::remove_file(&config).unwrap();
    assert_eq!(workspace::vmm::standby::retire_all(cli.home()), 1);
    // Both at once, each seeing A and not B.
    let listings: Vec<_> = std::thread::scope(|scope| {
        ["f1", "f2"]
            .map(|fork| scope.spawn(move || cli.run(&["exec", fork, "--", "ls", "/root"])))
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect()
    });
    for ls in &listings {
        assert_eq!(ls.status, 0, "{}", ls.stderr);
        let names: Vec<&str> = ls.stdout.split_whitespace().collect();
        assert!(names.contains(&"a") && !names.contains(&"b"), "{names:?}");
    }
    assert_eq!(
        sh("f1", "hostname").stdout,
        "f1\n",
        "a fork takes its own name"
    );
    // Each fork takes a MAC of its own, on an interface kept up (the
    // same addresses as the snapshot's: only the MAC changes, live).
    let mac = |name: &str| sh(name, "cat /sys/class/net/eth0/address").stdout;
    let (mac1, mac2) = (mac("f1"), mac("f2"));
    assert!(mac1.starts_with("02:4d:"), "{mac1}");
    assert_ne!(mac1, mac2, "forks of one snapshot share a MAC");
    // A fork's network comes up with it (a passt of its own).
    let fetched = cli.run(&["exec", "f2", "--", "wget", "-qO-", url]);
    assert_eq!(
        fetched.stdout, "from the host's loopback\n",
        "{}",
        fetched.stderr
    );
    // The balloon restored from the snapshot hands back the statistics
    // buffer it held, and reports freed memory again.
    crate::balloon::memory_given_back(cli, "f1");
    assert_eq!(sh("f1", "echo one > /root/only-f1").status, 0);
    assert_eq!(sh("f2", "test -e /root/only-f1").status, 1);
    let live = cli.ok_json(&["fork", "dev", "f3", "--json"]);
    assert_eq!(live["state"], "running");
    let f3 = cli.run(&["exec", "f3", "--", "ls", "/root"]);
    assert!(
        f3.stdout.split_whitespace().any(|n| n == "b"),
        "{}",
        f3.stdout
    );

    // In place: refused while running, then forced: A without B again.
    assert_eq!(
        cli.run(&["snapshot", "restore", "s1", "--json"])
            .error_code(),
        "CONFLICT"
    );
    let restored = cli.ok_json(&["snapshot", "restore", "s1", "--force", "--json"]);
    assert_eq!(restored["state"], "running", "{restored}");
    let ls = cli.run(&["exec", "dev", "--", "ls", "/root"]);
    let names: Vec<&str> = ls.stdout.split_whitespace().collect();
    assert!(names.contains(&"a") && !names.contains(&"b"), "{names:?}");

    let listed = cli.ok_json(&["snapshot", "ls", "--workspace", "dev", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 1);
    let state = cli.home().join("snapshots/s1/vm.state");
    let mut bytes = std::fs::read(&state).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&state, &bytes).unwrap();
    assert_eq!(
        cli.run(&["fork", "dev", "f4", "--snapshot", "s1", "--json"])
            .error_code(),
        "INVALID_INPUT"
    );
    assert!(
        !cli.home().join("workspaces/f4").exists(),
        "a refused fork left a workspace"
    );
    // A changed byte of guest memory (the kernel's text at 16 MiB) is seen too.
    cli.ok(&["snapshot", "take", "dev", "s2"]);
    let memory = cli.home().join("snapshots/s2/memory.raw");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&memory)
        .unwrap();
    let mut byte = [0u8];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut byte, 16 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[byte[0] ^ 0xff], 16 << 20).unwrap();
    let refused = cli.run(&["fork", "dev", "f4", "--snapshot", "s2", "--json"]);
    assert_eq!(refused.error_code(), "INVALID_INPUT", "{}", refused.stderr);
    cli.ok(&["snapshot", "rm", "s2"]);
    // So is a changed byte of the disk copy (its boot block, zeros).
    cli.ok(&["snapshot", "take", "dev", "s3"]);
    let disk = cli.home().join("snapshots/s3/disk-1.raw");
    let file = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[0xff], 0).unwrap();
    let refused = cli.run(&["fork", "dev", "f4", "--snapshot", "s3", "--json"]);
    assert_eq!(refused.error_code(), "INVALID_INPUT", "{}", refused.stderr);
    assert!(refused.stdout.contains("disk file"), "{}", refused.stdout);
    cli.ok(&["snapshot", "rm", "s3"]);
    cli.ok(&["snapshot", "rm", "s1"]);
    assert_eq!(
        cli.run(&["snapshot", "inspect", "s1", "--json"])
            .error_code(),
        "NOT_FOUND"
    );
    for fork in ["f1", "f2", "f3"] {
        cli.ok(&["delete", fork, "--yes", "--force"]);
    }

    // A fresh workspace of the same shape resumes the warm snapshot that
    // dev's first start kept (or used), and takes its own name.
    cli.ok(&["create", "w1", "--json"]);
    let began = Instant::now();
    let warm = cli.ok_json(&["start", "w1", "--json"]);
    assert_eq!(warm["runtime"]["start_kind"], "warm", "{warm}");
    eprintln!("w1 started warm in {:.1} s", began.elapsed().as_secs_f64());
    assert_eq!(sh("w1", "hostname").stdout, "w1\n");
    assert!(
        cli.run(&["logs", "w1"]).stdout.contains("Linux version"),
        "a warm start's console holds the boot it resumes"
    );
    cli.ok(&["delete", "w1", "--yes", "--force"]);
    assert!(events(cli, "dev").iter().any(|k| k == "snapshot_taken"));
}

/// A second uid (`nobody`) can read none of the first's guest memory,
/// snapshots, sockets or warm snapshots: not through the private state
/// directory, and not with its search bit opened either (each file and
/// directory inside is private too). Needs root to switch uids.
fn other_users_see_nothing(cli: &CliHome) {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || testkit::host_tool("setpriv").is_err() {
        testkit::skip(
            "other_users_see_nothing",
            "needs root and setpriv to act as a second user",
        );
        return;
    }
    let home = cli.home();
    let mut paths = vec![
        home.join("snapshots/s1/memory.raw"),
        home.join("snapshots/s1/vm.state"),
        home.join("snapshots/s1/disk-1.raw"),
        home.join("snapshots"),
        home.join("workspaces/dev/control.sock"),
        home.join("workspaces/dev/vsock.sock"),
        home.join("workspaces/dev/disk.ext4"),
    ];
    if let Some(warm) = testkit::shared_warm_dir() {
        paths.push(warm);
    }
    let as_nobody = |path: &std::path::Path| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(if path.is_dir() { "ls" } else { "cat" })
            .arg(path)
            .output()
            .unwrap()
    };
    let check = |why: &str| {
        for path in &paths {
            let out = as_nobody(path);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success() && stderr.contains("Permission denied"),
                "{why}: nobody read {}: {stderr}",
                path.display()
            );
        }
    };
    check("through the state directory");
    // Searchable by others for a moment: each path is still private.
    let root_mode = std::fs::metadata(home).unwrap().permissions().mode();
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o711)).unwrap();
    let inner = [home.join("snapshots"), home.join("workspaces")];
    let opened: Vec<_> = inner
        .iter()
        .map(|d| (d, std::fs::metadata(d).unwrap().permissions().mode()))
        .collect();
    for (dir, _) in &opened {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    let result = std::panic::catch_unwind(|| check("with the directories above searchable"));
    for (dir, was) in opened {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(was)).unwrap();
    }
    std::fs::set_permissions(home, std::fs::Permissions::from_mode(root_mode)).unwrap();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
