//! Named volumes on real guests: filled from a directory, written by the
//! guest's `user`, held read-write by one running workspace (a second is
//! CONFLICT and changes nothing), kept at a snapshot's instant for a fork,
//! read after the writer is deleted, read-only by two at once, exported.
//! Every start resumes the warm snapshot and fills its volume slots.

use std::os::unix::fs::PermissionsExt;

use crate::{can_boot, home, start};

#[test]
fn volumes_outlive_workspaces_and_forks_keep_their_instant() {
    if !can_boot("volumes_outlive_workspaces_and_forks_keep_their_instant") {
        return;
    }
    let cli = home("volumes");
    let sh = |ws: &str, line: &str| cli.run(&["exec", ws, "--shell", "--", line]);
    let out = |ws: &str, line: &str| {
        let run = sh(ws, line);
        assert_eq!(run.status, 0, "{ws}: {line}: {}", run.stderr);
        run.stdout
    };

    // A directory's files, with their modes, owned by the guest's `user`.
    let src = cli.home().join("volume-src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("run.sh"), "echo hi\n").unwrap();
    std::fs::set_permissions(src.join("run.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::write(src.join("sub/file"), "from the host\n").unwrap();
    let made = cli.ok_json(&[
        "volume",
        "create",
        "data",
        "--from",
        src.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(made["size_mib"], 1024, "{made}");
    let bad = cli.run(&["volume", "create", "data", "--json"]);
    assert_eq!(bad.error_code(), "CONFLICT");
    let bad = cli.run(&["create", "nope", "-v", "missing:/data", "--json"]);
    assert_eq!(bad.error_code(), "NOT_FOUND", "{}", bad.stderr);
    let bad = cli.run(&["create", "nope", "-v", "data:/etc", "--json"]);
    assert_eq!(bad.error_code(), "INVALID_INPUT", "{}", bad.stderr);
    assert_eq!(
        cli.run(&["inspect", "nope", "--json"]).error_code(),
        "NOT_FOUND"
    );

    // A plain workspace first, so the image's warm snapshot exists (a
    // first boot with volumes keeps none).
    cli.ok(&["create", "warmup"]);
    start(&cli, "warmup");
    cli.ok(&["delete", "warmup", "--force", "--yes"]);

    cli.ok(&["create", "w1", "-v", "data:/data"]);
    start(&cli, "w1");
    let w1 = cli.ok_json(&["inspect", "w1", "--json"]);
    assert_eq!(w1["runtime"]["start_kind"], "warm", "{w1}");
    assert_eq!(
        out("w1", "stat -c '%a %u' /data/run.sh; cat /data/sub/file"),
        "750 1000\nfrom the host\n"
    );
    let wrote = cli.run(&[
        "exec",
        "w1",
        "--user",
        "1000",
        "--shell",
        "--",
        "echo one > /data/note",
    ]);
    assert_eq!(
        wrote.status, 0,
        "the guest's user writes the root: {}",
        wrote.stderr
    );

    // Read-write to a second running workspace: CONFLICT, nothing changes.
    cli.ok(&["create", "w2", "-v", "data:/data"]);
    let refused = cli.run(&["start", "w2", "--json"]);
    assert_eq!(refused.error_code(), "CONFLICT", "{}", refused.stderr);
    assert!(
        refused.stderr.contains("w1"),
        "names the holder: {}",
        refused.stderr
    );
    assert_eq!(
        cli.ok_json(&["inspect", "w2", "--json"])["state"],
        "stopped"
    );
    assert_eq!(
        cli.run(&["volume", "rm", "data", "--json"]).error_code(),
        "CONFLICT"
    );
    let listed = cli.ok_json(&["volume", "inspect", "data", "--json"]);
    assert_eq!(listed["holders"].as_array().unwrap().len(), 2, "{listed}");

    // A fork sees the volume as at the snapshot; later writes stay apart.
    cli.ok(&["snapshot", "take", "w1", "before", "--json"]);
    assert_eq!(
        out("w1", "echo two > /data/note && sync && cat /data/note"),
        "two\n"
    );
    let forked = cli.ok_json(&["fork", "w1", "f1", "--snapshot", "before", "--json"]);
    assert_eq!(forked["spec"]["volumes"][0]["own_copy"], true, "{forked}");
    assert_eq!(out("f1", "cat /data/note"), "one\n");
    assert_eq!(
        out("f1", "echo fork > /data/note && sync && cat /data/note"),
        "fork\n"
    );
    assert_eq!(out("w1", "cat /data/note"), "two\n");

    // The writer deleted, a second workspace reads what it wrote.
    cli.ok(&["delete", "w1", "--force", "--yes"]);
    cli.ok(&["delete", "f1", "--force", "--yes"]);
    start(&cli, "w2");
    assert_eq!(out("w2", "cat /data/note"), "two\n");
    cli.ok(&["delete", "w2", "--force", "--yes"]);

    // Read-only to two at once; then read-write to a third is CONFLICT.
    for ws in ["r1", "r2"] {
        cli.ok(&["create", ws, "-v", "data:/data:ro"]);
        start(&cli, ws);
        assert_eq!(out(ws, "cat /data/note"), "two\n");
    }
    assert_ne!(sh("r1", "echo x > /data/note").status, 0, "read-only");
    cli.ok(&["create", "w3", "-v", "data:/data"]);
    assert_eq!(cli.run(&["start", "w3", "--json"]).error_code(), "CONFLICT");
    let export = cli.home().join("data.tar");
    let exported = cli.ok_json(&[
        "volume",
        "export",
        "data",
        export.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(exported["entries"], 4, "{exported}");
    for ws in ["r1", "r2", "w3"] {
        cli.ok(&["delete", ws, "--force", "--yes"]);
    }
    cli.ok(&["volume", "rm", "data"]);

    // A one-shot's outputs come back byte for byte before it goes.
    let dir = cli.home().join("outputs");
    let output = format!("/out/*.txt:{}", dir.display());
    let run = cli.run(&[
        "run",
        "--output",
        &output,
        "--",
        "sh",
        "-c",
        "mkdir -p /out && seq 1 20000 > /out/n.txt && head -c 3000 /dev/zero > /out/z.bin",
    ]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let expected: String = (1..=20000).map(|i| format!("{i}\n")).collect();
    assert_eq!(
        std::fs::read_to_string(dir.join("n.txt")).unwrap(),
        expected
    );
    assert!(!dir.join("z.bin").exists(), "only what the glob matched");
    assert_eq!(
        cli.ok_json(&["volume", "ls", "--json"]),
        serde_json::json!([])
    );
}
