//! A `passt` without the bulk-upload reset, for hosts whose Debian ships an
//! older one (Debian 12: snapshot 2023-03-09), as plan steps: `microagent
//! setup` shows and runs them, and `cargo xtask setup` runs the same.
//!
//! Snapshots before upstream commit 4e73e9b (2023-03-27) reset a guest's
//! TCP connection once its peer has sent nothing for ~24 s, so any upload
//! from a workspace on the default `user` network longer than that dies
//! (docs/networking.md, "passt versions"). Debian 13's passt is fixed but
//! needs a newer libc than Debian 12 has, so its source is built (libc
//! only, ~20 s) and installed to /usr/local/bin, where microagent looks
//! before /usr/bin. The build is kept in the asset cache, so a second host
//! setup (or CI run) only installs it.

use std::path::{Path, PathBuf};
use std::process::Command;

use base::host::plan::Step;
use base::network::PASST_FIXED_SNAPSHOT;

/// The Debian 13 source package built.
const SOURCE_PACKAGE: &str = "passt=0.0~git20250503.587980c-2+deb13u1";
/// The version it reports.
pub const VERSION: &str = "0.0~git20250503.587980c";
/// The cache key: the version and the build's revision (`-avx2`: both
/// binaries).
const CACHE_KEY: &str = "0.0~git20250503.587980c-avx2";
/// The upstream tarball `apt-get source` fetches.
const TARBALL: &str = "passt_0.0~git20250503.587980c.orig.tar.xz";
/// Pinned: the tarball is checked against this before it is unpacked.
const TARBALL_SHA256: &str = "69d5eb843f7d648c2cc60bfbca6ea7b5014c6b6f07cdee362c2a8cf490515a49";
/// Where it is installed; microagent's host tool lookup tries it first.
pub const INSTALL_DIR: &str = "/usr/local/bin";
/// Debian's archive, for the one source package (a private sources list:
/// the host's apt configuration is not changed).
const SOURCES: &str = "deb-src http://deb.debian.org/debian trixie main\n";
/// The binaries installed: `passt` runs its `.avx2` sibling where the CPU
/// has AVX2.
const BINARIES: [&str; 2] = ["passt.avx2", "passt"];
/// What the build needs.
pub const BUILD_PACKAGES: &[&str] = &["make", "gcc", "libc6-dev", "xz-utils"];
/// Roughly how long a build takes with its download, in seconds.
pub const SECONDS: u64 = 60;

/// Whether a host whose `passt` is (or, once installed, will be) the
/// snapshot `snapshot` needs ours: an older snapshot, or an unknown one
/// (no candidate to install).
pub fn needed(snapshot: Option<u32>) -> bool {
    snapshot.is_none_or(|d| d < PASST_FIXED_SNAPSHOT)
}

/// The snapshot of the `passt` the user network runs: the installed one,
/// else the one `apt-get install passt` would install.
pub fn snapshot_in_use() -> Option<u32> {
    if let Some(path) = base::network::passt_binary() {
        return base::network::passt_snapshot(&path);
    }
    let out = Command::new("apt-cache")
        .args(["policy", "passt"])
        .output()
        .ok()?;
    candidate_snapshot(&String::from_utf8_lossy(&out.stdout))
}

/// The snapshot of `apt-cache policy`'s candidate.
fn candidate_snapshot(policy: &str) -> Option<u32> {
    let candidate = policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:"))?;
    base::network::passt_snapshot_date(candidate.trim())
}

/// Where the cached build is.
fn cached_dir(cache_root: &Path) -> PathBuf {
    cache_root.join("passt").join(CACHE_KEY)
}

/// The steps that put our `passt` in [`INSTALL_DIR`]: download, check,
/// build into the cache (skipped when the cache has it), install.
pub fn steps(cache_root: &Path) -> Vec<Step> {
    let cached = cached_dir(cache_root);
    let mut steps = Vec::new();
    if !BINARIES.iter().all(|b| cached.join(b).is_file()) {
        steps.extend(build_steps(cache_root, &cached));
    }
    for binary in BINARIES {
        let from = cached.join(binary).display().to_string();
        let to = Path::new(INSTALL_DIR).join(binary).display().to_string();
        steps.push(Step::new(
            format!("install {to} (passt {VERSION})"),
            "install",
            &["-D", "-m", "0755", &from, &to],
        ));
    }
    steps
}

fn build_steps(cache_root: &Path, cached: &Path) -> Vec<Step> {
    let work = cache_root.join("build").join(format!("passt-{CACHE_KEY}"));
    let apt = work.join("apt");
    let src = work.join("src");
    let w = |p: &Path| p.display().to_string();
    let opts: Vec<String> = [
        format!(
            "Dir::Etc::sourcelist={}",
            apt.join("sources.list").display()
        ),
        "Dir::Etc::sourceparts=-".to_owned(),
        format!("Dir::State::Lists={}", apt.join("lists").display()),
        // Root downloads into our own directory, which `_apt` cannot write.
        "APT::Sandbox::User=root".to_owned(),
    ]
    .into_iter()
    .flat_map(|o| ["-o".to_owned(), o])
    .collect();
    let apt_get = |what: &str, tail: &[&str]| {
        let mut args: Vec<&str> = vec!["-qq"];
        args.extend(opts.iter().map(String::as_str));
        args.extend(tail);
        Step::new(what, "apt-get", &args)
    };
    let tarball = work.join(TARBALL);
    vec![
        Step::new("start the passt build afresh", "rm", &["-rf", &w(&work)]),
        Step::new(
            "make the build's directories",
            "mkdir",
            &["-p", &w(&apt.join("lists/partial")), &w(&src), &w(cached)],
        ),
        Step::new(
            "write a private sources list (Debian 13's sources)",
            "cp",
            &["/dev/stdin", &w(&apt.join("sources.list"))],
        )
        .with_stdin(SOURCES.to_owned()),
        apt_get("fetch Debian 13's source lists", &["update"]),
        apt_get(
            &format!("download the passt {VERSION} source"),
            &["source", "--download-only", "--tar-only", SOURCE_PACKAGE],
        )
        .in_dir(&w(&work)),
        Step::new(
            "check the source against its pinned digest",
            "sha256sum",
            &["--check", "--strict", "--quiet", "-"],
        )
        .with_stdin(format!("{TARBALL_SHA256}  {}\n", tarball.display())),
        Step::new(
            "unpack the source",
            "tar",
            &["-xf", &w(&tarball), "--strip-components=1", "-C", &w(&src)],
        ),
        Step::new(
            format!("build passt {VERSION}"),
            "make",
            &[
                "-C",
                &w(&src),
                "passt",
                "passt.avx2",
                &format!("VERSION={VERSION}"),
            ],
        ),
        Step::new(
            "keep the build in the asset cache",
            "cp",
            &[
                &w(&src.join("passt.avx2")),
                &w(&src.join("passt")),
                &w(cached),
            ],
        ),
        Step::new("remove the build directory", "rm", &["-rf", &w(&work)]),
    ]
}

/// What a plan with these steps says of them.
pub fn note(snapshot: Option<u32>) -> String {
    let why = match snapshot {
        Some(d) => format!("the passt this host has or would install is a snapshot of {d}, which resets a workspace's TCP connection once the far end has sent nothing for about 24 s"),
        None => "no passt package is known to this host's apt".to_owned(),
    };
    format!("builds passt {VERSION} from Debian 13's source (downloads from deb.debian.org, checks a pinned digest) and installs it in {INSTALL_DIR}: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_and_unknown_passts_need_ours() {
        assert!(needed(Some(20230309)));
        assert!(needed(None));
        assert!(!needed(Some(PASST_FIXED_SNAPSHOT)));
        assert!(!needed(Some(20250503)));
    }

    #[test]
    fn the_candidate_comes_from_apt_cache_policy() {
        let policy = "passt:\n  Installed: (none)\n  Candidate: 0.0~git20230309.7c7625d-1\n  Version table:\n";
        assert_eq!(candidate_snapshot(policy), Some(20230309));
        assert_eq!(
            candidate_snapshot("passt:\n  Installed: (none)\n  Candidate: (none)\n"),
            None
        );
    }

    #[test]
    fn a_cached_build_is_only_installed() {
        let root = std::env::temp_dir().join(format!("ma-passt-steps-{}", std::process::id()));
        let fresh = steps(&root);
        assert!(fresh.iter().any(|s| s.program == "make"), "{fresh:?}");
        let check = fresh.iter().find(|s| s.program == "sha256sum").unwrap();
        assert!(check.stdin.as_deref().unwrap().starts_with(TARBALL_SHA256));
        let download = fresh.iter().find(|s| s.args.contains(&"source".to_owned()));
        assert!(
            download.unwrap().dir.is_some(),
            "apt-get source writes to its directory"
        );
        let cached = cached_dir(&root);
        std::fs::create_dir_all(&cached).unwrap();
        for b in BINARIES {
            std::fs::write(cached.join(b), "").unwrap();
        }
        let again = steps(&root);
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(again.len(), 2, "{again:?}");
        assert!(again.iter().all(|s| s.program == "install"));
        assert!(again[1]
            .args
            .last()
            .unwrap()
            .ends_with("/usr/local/bin/passt"));
    }
}
