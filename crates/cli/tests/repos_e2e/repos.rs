//! `repo allow`, `create --repo`, `repo diff`, `repo pull`: a clone with
//! history on the work branch, owned by the guest's user, with no origin
//! on the host; a guest commit comes back as refs/workspaces/WS. Refusals
//! (not allowlisted, not a repository, an image without git) change
//! nothing.

use crate::{can_boot, git, home, make_repo};

#[test]
fn a_guest_commit_comes_back_to_the_host() {
    if !can_boot("a_guest_commit_comes_back_to_the_host") {
        return;
    }
    let cli = home("repopull");
    let repo = cli.home().join("proj");
    make_repo(&repo);
    git(&repo, &["checkout", "-qb", "feature"]);
    std::fs::write(repo.join("feature.txt"), "feature\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-qm", "feature work"]);
    git(&repo, &["checkout", "-q", "main"]);

    // Refusals first: nothing is made.
    let plain = cli.home().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let bad = cli.run(&["repo", "allow", plain.to_str().unwrap(), "--json"]);
    assert_eq!(bad.error_code(), "INVALID_INPUT", "{}", bad.stderr);
    let bad = cli.run(&[
        "create", "dev", "--image", "debian", "--repo", "proj", "--json",
    ]);
    assert_eq!(bad.error_code(), "FORBIDDEN", "{}", bad.stderr);
    assert!(
        bad.stderr.contains("repo allow"),
        "says what to do: {}",
        bad.stderr
    );
    let allowed = cli.ok_json(&["repo", "allow", repo.to_str().unwrap(), "--json"]);
    assert_eq!(allowed["alias"], "proj", "{allowed}");
    let listed = cli.ok_json(&["repo", "ls", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let bad = cli.run(&[
        "create", "dev", "--image", "minimal", "--repo", "proj", "--json",
    ]);
    assert_eq!(bad.error_code(), "INVALID_INPUT", "{}", bad.stderr);
    assert!(
        bad.stderr.contains("debian"),
        "names the image: {}",
        bad.stderr
    );
    let bad = cli.run(&[
        "create", "dev", "--image", "debian", "--repo", "proj", "--branch", "nope", "--json",
    ]);
    assert_eq!(bad.error_code(), "INVALID_INPUT", "{}", bad.stderr);
    assert_eq!(
        cli.run(&["inspect", "dev", "--json"]).error_code(),
        "NOT_FOUND"
    );

    // The clone: history, the work branch from `feature`, the user's.
    let made = cli.ok_json(&[
        "create", "dev", "--image", "debian", "--repo", "proj", "--branch", "feature", "--json",
    ]);
    assert_eq!(made["spec"]["repo"]["branch"], "feature", "{made}");
    let started = cli.ok_json(&["start", "dev", "--json"]);
    assert_eq!(started["state"], "running");
    let user = |line: &str| {
        let run = cli.run(&[
            "exec",
            "dev",
            "--user",
            "user",
            "--cwd",
            "/workspace/repo",
            "--shell",
            "--",
            line,
        ]);
        assert_eq!(run.status, 0, "{line}: {}", run.stderr);
        run.stdout
    };
    assert_eq!(
        user("git branch --show-current; git log --format=%s | tr '\\n' ,; echo; stat -c %U .; git remote | wc -l; git branch | wc -l"),
        "task/dev\nfeature work,first,\nuser\n0\n3\n"
    );
    assert!(
        !cli.home().join("workspaces/dev/repo.pending").exists(),
        "the clone is made once"
    );

    // Nothing new yet: the host is left as it was.
    let none = cli.ok_json(&["repo", "pull", "dev", "--json"]);
    assert_eq!(none["commits"], 0, "{none}");
    assert!(none["host_ref"].is_null(), "{none}");

    user("echo four >> notes.txt && git commit -qam 'guest change'");
    let diff = cli.ok(&["repo", "diff", "dev"]).stdout;
    assert!(diff.contains("+four"), "{diff}");
    let pulled = cli.ok_json(&["repo", "pull", "dev", "--json"]);
    assert_eq!(pulled["commits"], 1, "{pulled}");
    assert_eq!(pulled["host_ref"], "refs/workspaces/dev", "{pulled}");
    assert_eq!(
        git(&repo, &["log", "--format=%s", "-2", "refs/workspaces/dev"]),
        "guest change\nfeature work"
    );
    assert_eq!(
        git(&repo, &["rev-parse", "refs/workspaces/dev"]),
        pulled["head"]
    );
    // The host's branches and work tree are as they were.
    assert_eq!(git(&repo, &["branch", "--show-current"]), "main");
    assert_eq!(git(&repo, &["status", "--porcelain"]), "");
    assert_eq!(
        git(&repo, &["log", "--format=%s", "feature"]),
        "feature work\nfirst"
    );

    let bad = cli.run(&["repo", "pull", "nope", "--json"]);
    assert_eq!(bad.error_code(), "NOT_FOUND", "{}", bad.stderr);
    cli.ok(&["delete", "dev", "--force", "--yes"]);
    let removed = cli.ok_json(&["repo", "rm", "proj", "--json"]);
    assert_eq!(removed["removed"]["alias"], "proj");
    assert_eq!(
        cli.run(&["repo", "rm", "proj", "--json"]).error_code(),
        "FORBIDDEN"
    );
}
