//! Repositories on real `debian` guests (which have git), through the
//! `microagent` binary, with git repositories the tests make. Every start
//! after the first resumes the image's warm snapshot.

use std::path::Path;
use testkit::cli::CliHome;
use testkit::git;

mod guide;
mod repos;
mod seeds;
mod tasks;

/// Whether this host can boot `debian` workspaces and has git; prints the
/// reason and records a skip when not.
fn can_boot(test: &str) -> bool {
    testkit::require(test, testkit::guest_assets()).is_some()
        && testkit::require(test, testkit::workspace_image("debian")).is_some()
        && testkit::require(test, testkit::host_tool("mkfs.ext4")).is_some()
        && testkit::require(test, testkit::host_tool("git")).is_some()
}

fn home(test: &str) -> CliHome {
    CliHome::new(env!("CARGO_BIN_EXE_microagent"), test)
}

/// A repository at `dir` with one commit on `main` (README and notes.txt).
fn make_repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README"), "a test repository\n").unwrap();
    std::fs::write(dir.join("notes.txt"), "one\ntwo\nthree\n").unwrap();
    git(dir, &["add", "."]);
    git(dir, &["commit", "-qm", "first"]);
}
