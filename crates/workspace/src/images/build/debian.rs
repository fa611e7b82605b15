//! A Debian root filesystem from packages: `mmdebstrap --mode=root
//! --skip=chroot/mount` (dpkg chrooted into the tree, nothing mounted, so
//! nothing is left behind), minbase plus what workspaces need and the
//! packages asked for. Needs root, and Debian's mirrors.

use std::path::Path;
use std::process::Command;

use super::ImageBuildError;

/// What every Debian image gets beyond minbase (the agent's tools and
/// what the `debian` image has).
pub const BASE_PACKAGES: &[&str] = &["ca-certificates", "procps", "coreutils", "bash"];
/// Host packages a Debian build runs.
pub const HOST_PACKAGES: &[&str] = &["mmdebstrap", "debian-archive-keyring"];
/// The apt variant.
const VARIANT: &str = "minbase";
/// Where the archive's keyring is, on the host and in the image.
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// Adds the unprivileged user every built image has (uid and gid 1000,
/// a home, bash), chrooted into the finished tree.
pub const USER_HOOK: &str =
    "--customize-hook=chroot \"$1\" useradd --create-home --uid 1000 --user-group --shell /bin/bash user";
/// What a build downloads and unpacks, roughly (minbase is ~150 MB).
pub const DISK_BYTES: u64 = 1 << 30;
/// Roughly how long mmdebstrap takes for minbase.
pub const SECONDS: u64 = 180;

/// A suite name as Debian spells them (`bookworm`, `trixie`).
pub fn valid_suite(suite: &str) -> bool {
    !suite.is_empty() && suite.len() <= 32 && suite.bytes().all(|b| b.is_ascii_lowercase())
}

/// A Debian package name (policy 5.6.1): lowercase letters, digits, `+-.`,
/// at least two characters, starting with a letter or digit.
pub fn valid_package(name: &str) -> bool {
    name.len() >= 2
        && name.len() <= 128
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
}

/// The apt sources of `suite` (also the image's sources.list).
pub fn sources(suite: &str) -> Vec<String> {
    [
        ("debian", suite.to_owned()),
        ("debian", format!("{suite}-updates")),
        ("debian-security", format!("{suite}-security")),
    ]
    .into_iter()
    .map(|(archive, dist)| {
        format!("deb [signed-by={KEYRING}] http://deb.debian.org/{archive} {dist} main")
    })
    .collect()
}

/// The packages of an image: ours, then those asked for (no repeats).
pub fn include(packages: &[String]) -> Vec<String> {
    let mut all: Vec<String> = BASE_PACKAGES.iter().map(|p| (*p).to_owned()).collect();
    for p in packages {
        if !all.contains(p) {
            all.push(p.clone());
        }
    }
    all
}

/// The mmdebstrap command line that makes `tree`.
pub fn mmdebstrap_args(suite: &str, packages: &[String], tree: &Path) -> Vec<String> {
    let mut args = vec![
        "--mode=root".to_owned(),
        format!("--variant={VARIANT}"),
        "--skip=chroot/mount".to_owned(),
        "--skip=check/signed-by".to_owned(),
        format!("--include={}", include(packages).join(",")),
        USER_HOOK.to_owned(),
        "--aptopt=Acquire::Retries \"3\"".to_owned(),
        suite.to_owned(),
        tree.display().to_string(),
    ];
    args.extend(sources(suite));
    args
}

/// Makes `tree` with mmdebstrap; `log` gets its output.
pub fn bootstrap(
    suite: &str,
    packages: &[String],
    tree: &Path,
    log: &Path,
) -> Result<(), ImageBuildError> {
    let log_file = std::fs::File::create(log).map_err(|source| ImageBuildError::Io {
        what: format!("creating {}", log.display()),
        source,
    })?;
    let err_file = log_file.try_clone().map_err(|source| ImageBuildError::Io {
        what: format!("opening {}", log.display()),
        source,
    })?;
    let status = Command::new("mmdebstrap")
        .args(mmdebstrap_args(suite, packages, tree))
        .stdout(log_file)
        .stderr(err_file)
        .status()
        .map_err(|source| ImageBuildError::Io {
            what: "running mmdebstrap".into(),
            source,
        })?;
    if status.success() {
        // The host's resolver means nothing in the guest; the agent writes
        // the workspace's at boot.
        let resolv = tree.join("etc/resolv.conf");
        let _ = std::fs::remove_file(&resolv);
        let _ = std::fs::write(&resolv, "");
        return Ok(());
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    Err(ImageBuildError::Bootstrap {
        status: status.to_string(),
        tail: lines[lines.len().saturating_sub(15)..].join("\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_installs_ours_and_the_asked_packages() {
        let args = mmdebstrap_args(
            "bookworm",
            &["git".into(), "bash".into()],
            Path::new("/w/tree"),
        );
        assert!(args.contains(&"--mode=root".to_owned()));
        assert!(args.contains(&"--skip=chroot/mount".to_owned()));
        assert!(args.contains(&"--include=ca-certificates,procps,coreutils,bash,git".to_owned()));
        assert!(
            args.contains(&USER_HOOK.to_owned()),
            "the unprivileged user"
        );
        let suite = args.iter().position(|a| a == "bookworm").unwrap();
        assert_eq!(args[suite + 1], "/w/tree");
        assert_eq!(args.len(), suite + 2 + 3);
        assert!(args[suite + 4].contains("debian-security bookworm-security main"));
    }

    #[test]
    fn suites_and_packages_are_checked() {
        assert!(valid_suite("bookworm") && valid_suite("trixie"));
        for bad in ["", "Bookworm", "bookworm;rm", "../x", "bookworm-updates"] {
            assert!(!valid_suite(bad), "{bad}");
        }
        for good in ["git", "python3", "g++", "libc6-dev", "0ad"] {
            assert!(valid_package(good), "{good}");
        }
        for bad in ["", "a", "Git", "-x", "git,curl", "a b", "--include=x"] {
            assert!(!valid_package(bad), "{bad}");
        }
    }
}
