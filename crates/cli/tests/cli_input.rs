//! Bad input through the CLI, no KVM needed: every command answers with its
//! stable error code in `--json` and leaves the state directory as it was.

use testkit::cli::CliHome;
use testkit::terminal::Terminal;

fn home(test: &str) -> CliHome {
    CliHome::new(env!("CARGO_BIN_EXE_microagent"), test)
}

#[test]
fn bad_input_gets_its_code_and_changes_nothing() {
    let cli = home("badinput");
    let src = cli.home().join("src");
    testkit::fake_image_files(&src);
    let src = src.to_str().unwrap().to_owned();
    let mk = |args: &[&str]| {
        let mut cmd = cli.command(args);
        // No asset cache: only the fake image exists.
        cmd.env("MICROAGENT_CACHE", cli.home().join("no-cache"));
        testkit::cli::CliRun::from(cmd.stdin(std::process::Stdio::null()).output().unwrap())
    };
    assert_eq!(
        mk(&["image", "import", &src, "--name", "fake", "--json"]).status,
        0
    );
    let created = mk(&[
        "create", "dev", "--image", "fake", "--label", "team=a", "--json",
    ]);
    assert_eq!(created.status, 0, "{}", created.stderr);
    assert_eq!(created.json()["state"], "stopped");
    let empty = cli.home().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let empty = empty.to_str().unwrap().to_owned();

    let before = cli.snapshot();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["create", "Bad_Name"], "INVALID_INPUT"),
        (vec!["create", "dev", "--image", "fake"], "CONFLICT"),
        (
            vec!["create", "other", "--image", "fake", "--vcpus", "0"],
            "INVALID_INPUT",
        ),
        (
            vec!["create", "other", "--image", "fake", "--mem", "1"],
            "INVALID_INPUT",
        ),
        (
            vec!["create", "other", "--image", "fake", "--ttl", "0"],
            "INVALID_INPUT",
        ),
        (
            vec!["create", "other", "--image", "fake", "--network", "corp"],
            "NOT_FOUND",
        ),
        (
            vec!["create", "other", "--image", "fake", "--network", "Corp"],
            "INVALID_INPUT",
        ),
        (vec!["network", "inspect", "corp"], "NOT_FOUND"),
        (vec!["network", "rm", "user"], "CONFLICT"),
        (
            vec![
                "network", "create", "corp", "--egress", "none", "--allow", "pypi.org",
            ],
            "INVALID_INPUT",
        ),
        (
            vec!["network", "create", "corp", "--subnet", "10.0.0.1/24"],
            "INVALID_INPUT",
        ),
        (
            vec!["network", "setup", "--confirm", "1-2-3"],
            "INVALID_INPUT",
        ),
        (vec!["create", "other", "--image", "nope"], "NOT_FOUND"),
        (
            vec!["create", "other", "--image", "fake", "--env", "novalue"],
            "INVALID_INPUT",
        ),
        (vec!["start", "ghost"], "NOT_FOUND"),
        (vec!["start", "Bad_Name"], "INVALID_INPUT"),
        (vec!["stop", "ghost"], "NOT_FOUND"),
        (vec!["halt", "ghost"], "NOT_FOUND"),
        (vec!["delete", "ghost", "--yes"], "NOT_FOUND"),
        (vec!["delete", "dev"], "INVALID_INPUT"),
        (vec!["inspect", "ghost"], "NOT_FOUND"),
        (
            vec!["server", "add", "local", "--ssh", "me@h"],
            "INVALID_INPUT",
        ),
        (
            vec!["server", "add", "box", "--ssh", "me@-oProxyCommand=x"],
            "INVALID_INPUT",
        ),
        (
            vec![
                "server",
                "add",
                "box",
                "--ssh",
                "me@h",
                "--ssh-option",
                "nokey",
            ],
            "INVALID_INPUT",
        ),
        (vec!["server", "status", "ghost"], "NOT_FOUND"),
        (vec!["server", "rm", "ghost"], "NOT_FOUND"),
        (vec!["--server", "ghost", "doctor"], "NOT_FOUND"),
        (vec!["--server", "ghost", "create", "other"], "NOT_FOUND"),
        (vec!["--server", "box", "vmm", "probe"], "INVALID_INPUT"),
        (
            vec!["port", "add", "dev", "8080:80", "--forward"],
            "INVALID_INPUT",
        ),
        (vec!["browser", "open", "dev", "ftp://x/"], "INVALID_INPUT"),
        (
            vec!["browser", "open", "dev", "file:///etc/passwd"],
            "INVALID_INPUT",
        ),
        (
            vec!["browser", "open", "dev", "http://x/", "--page", "a b"],
            "INVALID_INPUT",
        ),
        (
            vec!["browser", "open", "dev", "http://x/", "--timeout", "0"],
            "INVALID_INPUT",
        ),
        (vec!["browser", "open", "dev", "http://x/"], "NOT_RUNNING"),
        (vec!["browser", "open", "ghost", "http://x/"], "NOT_FOUND"),
        (vec!["browser", "click", "dev"], "INVALID_INPUT"),
        (vec!["browser", "snapshot", "dev"], "NOT_RUNNING"),
        (vec!["browser", "events", "ghost"], "NOT_FOUND"),
        (vec!["ttl", "dev", "soon"], "INVALID_INPUT"),
        (vec!["ttl", "ghost", "10"], "NOT_FOUND"),
        (vec!["exec", "dev", "--", "true"], "NOT_RUNNING"),
        (vec!["exec", "ghost", "--", "true"], "NOT_FOUND"),
        (
            vec!["exec", "dev", "--timeout", "0", "--", "true"],
            "INVALID_INPUT",
        ),
        (vec!["cp", "/etc/hostname", "/tmp/x"], "INVALID_INPUT"),
        (vec!["cp", "/etc/hostname", "dev:relative"], "INVALID_INPUT"),
        (vec!["cp", "/does/not/exist", "dev:/tmp/x"], "INVALID_INPUT"),
        (vec!["cp", "/etc/hostname", "dev:/tmp/x"], "NOT_RUNNING"),
        (vec!["cp", "ghost:/etc/hostname", "/tmp/x"], "NOT_FOUND"),
        (vec!["logs", "ghost"], "NOT_FOUND"),
        (vec!["-n", "Team", "list"], "INVALID_INPUT"),
        (vec!["-n", "team-a", "inspect", "dev"], "NOT_FOUND"),
        (vec!["create", "dev.default"], "INVALID_INPUT"),
        (vec!["create", "x.y.z"], "INVALID_INPUT"),
        (vec!["events", "ghost"], "NOT_FOUND"),
        (vec!["events", "dev", "--wait", "100000"], "INVALID_INPUT"),
        (vec!["list", "--state", "sleeping"], "INVALID_INPUT"),
        (vec!["image", "inspect", "nope"], "NOT_FOUND"),
        (vec!["image", "rm", "fake"], "CONFLICT"),
        (vec!["image", "rm", "nope"], "NOT_FOUND"),
        (
            vec!["image", "import", &empty, "--name", "other"],
            "INVALID_INPUT",
        ),
        (vec!["image", "import", &src, "--name", "fake"], "CONFLICT"),
        (vec!["run", "--image", "nope", "--", "true"], "NOT_FOUND"),
        (vec!["run", "--vcpus", "99", "--", "true"], "INVALID_INPUT"),
        (vec!["run", "--secret", "NOPE", "--", "true"], "NOT_FOUND"),
        (vec!["secret", "rm", "NOPE"], "NOT_FOUND"),
        (vec!["secret", "set", "1BAD"], "INVALID_INPUT"),
        (vec!["secret", "set", "EMPTY"], "INVALID_INPUT"),
    ];
    for (args, code) in cases {
        let mut args = args.clone();
        // Options go before the command of exec and run.
        let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        args.insert(at, "--json");
        let run = mk(&args);
        assert_ne!(run.status, 0, "{args:?} succeeded");
        assert_eq!(run.error_code(), code, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains(code),
            "{args:?}: the message on stderr names the code: {}",
            run.stderr
        );
        assert_eq!(
            cli.snapshot(),
            before,
            "{args:?} changed the state directory"
        );
    }
    // exec and run report their own failures with 125, other commands with 1.
    assert_eq!(mk(&["exec", "dev", "--json", "--", "true"]).status, 125);
    assert_eq!(mk(&["inspect", "ghost", "--json"]).status, 1);

    // What worked stays intact and usable.
    let list = mk(&["list", "--label", "team=a", "--json"]).json();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["name"], "dev");
    assert!(mk(&["list", "--label", "team=b", "--json"])
        .json()
        .as_array()
        .unwrap()
        .is_empty());
    let deleted = mk(&["delete", "dev", "--yes", "--json"]);
    assert_eq!(deleted.status, 0, "{}", deleted.stderr);
    assert_eq!(mk(&["image", "rm", "fake", "--json"]).status, 0);
    let left: Vec<_> = std::fs::read_dir(cli.home().join("workspaces"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "delete leaves nothing: {left:?}");
}

#[test]
fn contract_and_help_are_available_without_kvm() {
    let cli = home("contract");
    let contract = cli.ok_json(&["contract"]);
    assert_eq!(contract["error_codes"].as_array().unwrap().len(), 8);
    assert_eq!(contract["exec_failure_exit_code"], 125);
    let help = cli.run(&["--help"]);
    assert_eq!(help.status, 0);
    for cmd in [
        "create",
        "start",
        "stop",
        "halt",
        "hibernate",
        "resume",
        "delete",
        "list",
        "inspect",
        "exec",
        "cp",
        "logs",
        "events",
        "run",
        "image",
        "doctor",
    ] {
        assert!(help.stdout.contains(cmd), "--help lists {cmd}");
    }
    let usage = cli.run(&["create"]);
    assert_eq!(usage.status, 2, "a usage error exits 2");
}

/// `microagent-vmm`, the program `microagent start` runs beside itself,
/// takes exactly the arguments the library's `VmmLaunch` writes, and a
/// launch the workspace did not expect changes nothing.
#[test]
fn the_vmm_program_understands_the_library_launch_and_nothing_else() {
    let vmm = testkit::vmm_program_beside(std::path::Path::new(env!("CARGO_BIN_EXE_microagent")));
    let usage = std::process::Command::new(&vmm).output().unwrap();
    assert_eq!(usage.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&usage.stderr)
        .contains("--home DIR --kernel VARIANT [--restore DIR] NAME"));

    let cli = home("vmmprog");
    let src = cli.home().join("src");
    testkit::fake_image_files(&src);
    let mut cmd = cli.command(&["image", "import", src.to_str().unwrap(), "--name", "fake"]);
    assert!(cmd.output().unwrap().status.success());
    let mut cmd = cli.command(&["create", "dev", "--image", "fake", "--json"]);
    assert!(cmd.output().unwrap().status.success());
    let before = cli.snapshot();
    let launch = workspace::vmm::launch::VmmLaunch::new(
        &vmm,
        cli.home(),
        "dev",
        workspace::KernelVariant::Standard,
    );
    // The workspace is stopped, not starting for this process: refused.
    let out = std::process::Command::new(&launch.program)
        .args(launch.args())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("was not started for it"),
        "stderr: {stderr}"
    );
    assert_eq!(cli.snapshot(), before, "the refused launch changed nothing");
}

#[test]
fn secrets_are_set_listed_and_removed_without_their_values() {
    use std::io::Write;
    let cli = home("secrets");
    let mut set = cli
        .command(&["secret", "set", "API_TOKEN"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    set.stdin.take().unwrap().write_all(b"hunter2\n").unwrap();
    let set = set.wait_with_output().unwrap();
    assert!(set.status.success());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&set.stdout),
        String::from_utf8_lossy(&set.stderr)
    );
    assert!(!said.contains("hunter2"), "{said}");
    let stored = cli.home().join("secrets/API_TOKEN");
    assert_eq!(
        std::fs::read(&stored).unwrap(),
        b"hunter2",
        "one newline dropped"
    );
    let file = cli.home().join("value.txt");
    std::fs::write(&file, "from a file\n").unwrap();
    cli.ok(&[
        "secret",
        "set",
        "FROM_FILE",
        "--from-file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(cli.home().join("secrets/FROM_FILE")).unwrap(),
        b"from a file\n",
        "a file is taken as it is"
    );
    let listed = cli.ok_json(&["secret", "ls", "--json"]);
    assert_eq!(listed[0]["name"], "API_TOKEN", "{listed}");
    assert_eq!(listed[1]["name"], "FROM_FILE", "{listed}");
    assert!(!listed.to_string().contains("hunter2"), "{listed}");
    let table = cli.ok(&["secret", "ls"]);
    assert!(table.stdout.contains("API_TOKEN") && !table.stdout.contains("hunter2"));
    let removed = cli.ok_json(&["secret", "rm", "API_TOKEN", "--json"]);
    assert_eq!(removed["secret"]["name"], "API_TOKEN");
    assert!(!stored.exists());
}

/// A task record as a guest could have filled it (its summary and error,
/// the merge's reason and conflicting paths from its commits): `task info`
/// and `task ls` print it escaped, `--json` keeps it exact.
#[test]
fn a_task_record_from_a_guest_prints_escaped() {
    let cli = home("taskescape");
    let dir = cli.home().join("tasks").join("t-esc");
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&dir)
        .unwrap();
    let summary = "done\u{1b}]0;pwned\u{7}\u{1b}[2J\r\nall good";
    let record = serde_json::json!({
        "task_id": "t-esc", "status": "failed", "repo": "app", "branch": "main",
        "base": "0123456789abcdef0123", "image": "debian",
        "description": "fix\u{1b}[8m hidden", "workspace": "task-t-esc", "keep": false,
        "timings": {"created_ms": 1},
        "result": {"success": false, "summary": summary},
        "merge_result": {"merged": false, "commits": 1, "task_ref": "refs/tasks/t-esc",
                         "conflicts": ["a\u{9b}31mb"], "reason": "no\u{202e}txt.exe"},
        "error": "guest said \u{1b}[?1049h",
    });
    std::fs::write(dir.join("task.json"), record.to_string()).unwrap();

    let info = cli.ok(&["task", "info", "t-esc"]);
    let ls = cli.ok(&["task", "ls"]);
    for out in [&info.stdout, &ls.stdout] {
        assert!(
            !out.contains(['\u{1b}', '\u{7}', '\r', '\u{9b}', '\u{202e}']),
            "{out:?}"
        );
    }
    assert!(
        info.stdout
            .contains("result:    failure: done^[]0;pwned^G^[[2J^M^Jall good\n"),
        "{}",
        info.stdout
    );
    assert!(info.stdout.contains("^[[?1049h"), "{}", info.stdout);
    assert!(
        info.stdout.contains("no\\u{202e}txt.exe"),
        "{}",
        info.stdout
    );
    assert!(info.stdout.contains("a\\u{9b}31mb"), "{}", info.stdout);
    assert!(ls.stdout.contains("fix^[[8m hidden"), "{}", ls.stdout);
    // JSON carries the exact text for programs.
    let json = cli.ok_json(&["task", "info", "t-esc", "--json"]);
    assert_eq!(json["result"]["summary"], summary);
}

/// The names and flags people type by habit (docker, kubectl, coreutils):
/// `ls`/`list` and `rm`/`remove`/`delete` on every group, several names
/// for `delete`, `-m 1g` and `--cpus`, `-w`, `--tail`, `-f`, and shell
/// completion that bash loads.
#[test]
fn the_names_people_type_by_habit_work() {
    let cli = home("habits");
    let src = cli.home().join("src");
    testkit::fake_image_files(&src);
    let src = src.to_str().unwrap().to_owned();
    cli.ok_json(&["image", "import", &src, "--name", "fake", "--json"]);
    let a = cli.ok_json(&[
        "create", "a", "--image", "fake", "-m", "512m", "--cpus", "2", "--json",
    ]);
    assert_eq!(a["spec"]["mem_mib"], 512, "{a}");
    assert_eq!(a["spec"]["vcpus"], 2, "{a}");
    let b = cli.ok_json(&["create", "b", "--image", "fake", "--memory", "1g", "--json"]);
    assert_eq!(b["spec"]["mem_mib"], 1024, "{b}");
    for list in ["ls", "list"] {
        let listed = cli.ok_json(&[list, "--json"]);
        assert_eq!(listed.as_array().map(Vec::len), Some(2), "{list}: {listed}");
    }
    for group in [
        "image", "volume", "repo", "task", "secret", "pool", "kernel", "snapshot", "network",
        "server",
    ] {
        for list in ["ls", "list"] {
            let run = cli.run(&[group, list, "--json"]);
            assert_eq!(run.status, 0, "{group} {list}: {}", run.stderr);
        }
    }
    for rm in ["rm", "remove", "delete"] {
        let run = cli.run(&["volume", rm, "nope", "--json"]);
        assert_eq!(run.error_code(), "NOT_FOUND", "volume {rm}: {}", run.stderr);
    }
    // Several names: each in turn, a failure said and the next one done.
    let deleted = cli.run(&["rm", "-y", "nope", "a", "--json"]);
    assert_eq!(deleted.status, 1, "{}", deleted.stderr);
    let lines: Vec<serde_json::Value> = deleted
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", deleted.stdout);
    assert_eq!(lines[0]["error"]["code"], "NOT_FOUND");
    assert_eq!(lines[1]["deleted"], "a");
    let deleted = cli.run(&["remove", "--yes", "b", "--json"]);
    assert_eq!(deleted.status, 0, "{}", deleted.stderr);
    assert_eq!(deleted.json()["deleted"], "b", "one name: one document");

    // Through --server, one at a time: one ssh call cannot say which of
    // several it deleted.
    let remote = cli.run(&["rm", "-y", "a", "b", "--server", "box", "--json"]);
    assert_eq!(remote.error_code(), "INVALID_INPUT", "{}", remote.stderr);

    let help = cli.run(&["--help"]);
    assert!(help.stdout.contains("Examples:"), "{}", help.stdout);
    let first = help
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        first.trim_start().starts_with("run "),
        "everyday commands first: {first}"
    );
    for (cmd, flag) in [
        ("exec", "--workdir"),
        ("logs", "--tail"),
        ("events", "-f, --follow"),
        ("create", "--memory"),
    ] {
        let help = cli.run(&[cmd, "--help"]);
        assert!(help.stdout.contains(flag), "{cmd} --help: {}", help.stdout);
    }

    let script = cli.run(&["completion", "bash"]);
    assert_eq!(script.status, 0, "{}", script.stderr);
    let file = cli.home().join("completion.bash");
    std::fs::write(&file, &script.stdout).unwrap();
    let loaded = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p microagent",
            file.display()
        ))
        .output()
        .unwrap();
    assert!(loaded.status.success(), "{loaded:?}");
    assert!(String::from_utf8_lossy(&loaded.stdout).contains("microagent"));
    for shell in ["zsh", "fish"] {
        assert_eq!(cli.run(&["completion", shell]).status, 0, "{shell}");
    }
    assert_eq!(
        cli.run(&["completion", "bash", "--json"]).error_code(),
        "INVALID_INPUT"
    );
    // A reader that stops early ends it quietly (no panic, status 0).
    let early = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' completion bash | head -c 10 >/dev/null; exit ${{PIPESTATUS:-0}}",
            env!("CARGO_BIN_EXE_microagent")
        ))
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&early.stderr).contains("panicked"),
        "{early:?}"
    );
}

#[test]
fn a_missing_library_image_is_offered_at_a_terminal_and_declining_changes_nothing() {
    let cli = home("first-need");
    // Not at a terminal: the error as before, its remedy naming setup.
    let plain = cli.run(&["create", "w", "--image", "browser", "--json"]);
    assert_eq!(plain.error_code(), "NOT_FOUND", "{}", plain.stderr);
    assert!(plain.stderr.contains("--with browser"), "{}", plain.stderr);
    // At a terminal: the plan, the question, and with "n" nothing built
    // or made.
    let wait = std::time::Duration::from_secs(60);
    let mut term = Terminal::spawn(cli.command(&["create", "w", "--image", "browser"]), 24, 80);
    term.wait_for("build `browser` now? [y/N]", wait);
    term.type_text("n\n");
    term.wait_for("not built (", wait);
    let status = term.wait_exit(wait);
    let shown = term.screen();
    assert!(
        shown.contains("the image `browser` is not built on this host yet")
            && shown.contains("image build plan:"),
        "{shown}"
    );
    assert!(!status.success(), "{shown}");
    let listed = cli.ok_json(&["ls", "--json"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "{listed}");
    let images = cli.ok_json(&["image", "ls", "--json"]);
    assert!(!images.to_string().contains("\"browser\""), "{images}");
}
