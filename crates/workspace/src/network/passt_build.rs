//! Our `passt`, as plan steps: `microagent setup` shows and runs them, and
//! `cargo xtask setup` runs the same.
//!
//! Debian 13's passt source (a pinned snapshot) with Debian's fix for
//! outbound broadcast packets and our patch for one guest per passt
//! (`passt-one-guest.patch`: its tables written only as they are used, so
//! an idle workspace's network costs about 0.5 MiB instead of 14 MiB;
//! docs/networking.md, "passt for one guest"). It also has what Debian 12's
//! older snapshot lacks: upstream commit 4e73e9b (2023-03-27), without which
//! a guest's TCP connection is reset once its peer has sent nothing for
//! ~24 s. It is built against the host's libc (~20 s) and installed to
//! /usr/local/bin, where microagent looks before /usr/bin. The build is kept
//! in the asset cache under a key that names the patch's revision, so a
//! second host setup (or CI run) only installs it.

use std::path::{Path, PathBuf};
use std::process::Command;

use base::host::plan::Step;
use base::network::PASST_FIXED_SNAPSHOT;

/// The Debian 13 source package built.
const SOURCE_PACKAGE: &str = "passt=0.0~git20250503.587980c-2+deb13u1";
/// The upstream snapshot.
const UPSTREAM: &str = "0.0~git20250503.587980c";
/// The version it reports: the snapshot and our patch's revision, which
/// tells ours from any other build of that snapshot.
pub const VERSION: &str = "0.0~git20250503.587980c+microagent1";
/// The cache key: the version and the build's revision (`-avx2`: both
/// binaries).
const CACHE_KEY: &str = "0.0~git20250503.587980c+microagent1-avx2";
/// The upstream tarball `apt-get source` fetches.
const TARBALL: &str = "passt_0.0~git20250503.587980c.orig.tar.xz";
/// Pinned: the tarball is checked against this before it is unpacked.
const TARBALL_SHA256: &str = "69d5eb843f7d648c2cc60bfbca6ea7b5014c6b6f07cdee362c2a8cf490515a49";
/// Debian's packaging of it, fetched with it: its patches.
const DEBIAN_TARBALL: &str = "passt_0.0~git20250503.587980c-2+deb13u1.debian.tar.xz";
/// Pinned as the source is.
const DEBIAN_TARBALL_SHA256: &str =
    "f8d9fdfc1ba89e7dde48705ae68d1dfa8a40477cb85184d41194487f2902b77d";
/// Debian's fix applied (a guest's UDP packet to a broadcast address could
/// stop passt), as Debian ships it.
const DEBIAN_PATCH: &str = "debian/patches/fix-podman-issue-26073.patch";
/// Our patch, applied after Debian's: the tables one guest needs, written
/// only as they are used (see the file's header).
const ONE_GUEST_PATCH: &str = include_str!("passt-one-guest.patch");
/// Where it is installed; microagent's host tool lookup tries it first.
pub const INSTALL_DIR: &str = "/usr/local/bin";
/// Debian's archive, for the one source package (a private sources list:
/// the host's apt configuration is not changed).
const SOURCES: &str = "deb-src http://deb.debian.org/debian trixie main\n";
/// The binaries installed: `passt` runs its `.avx2` sibling where the CPU
/// has AVX2.
const BINARIES: [&str; 2] = ["passt.avx2", "passt"];
/// What the build needs.
pub const BUILD_PACKAGES: &[&str] = &["make", "gcc", "libc6-dev", "xz-utils", "patch"];
/// Roughly how long a build takes with its download, in seconds.
pub const SECONDS: u64 = 60;

/// The `passt` the user network runs, or would run once installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PasstInUse {
    /// Its snapshot date (`None`: none installed and none known to apt).
    pub snapshot: Option<u32>,
    /// Whether it is ours at this revision ([`VERSION`]).
    pub ours: bool,
}

/// Whether the host needs ours built and installed: anything else (another
/// build, an older revision of ours, Debian's) lacks the patch.
pub fn needed(in_use: PasstInUse) -> bool {
    !in_use.ours
}

/// The `passt` in use: the installed one, else the one `apt-get install
/// passt` would install.
pub fn in_use() -> PasstInUse {
    if let Some(path) = base::network::passt_binary() {
        return PasstInUse {
            snapshot: base::network::passt_snapshot(&path),
            ours: is_ours(&path),
        };
    }
    let snapshot = Command::new("apt-cache")
        .args(["policy", "passt"])
        .output()
        .ok()
        .and_then(|out| candidate_snapshot(&String::from_utf8_lossy(&out.stdout)));
    PasstInUse {
        snapshot,
        ours: false,
    }
}

/// Whether the binary at `path` is ours at this revision: it holds
/// [`VERSION`] (`passt --version` exits without flushing a piped stdout).
pub fn is_ours(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|bytes| {
        bytes
            .windows(VERSION.len())
            .any(|w| w == VERSION.as_bytes())
    })
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
    let debian_tarball = work.join(DEBIAN_TARBALL);
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
            &format!("download the passt {UPSTREAM} source"),
            &["source", "--download-only", "--tar-only", SOURCE_PACKAGE],
        )
        .in_dir(&w(&work)),
        // Apart: the archive may not serve the .dsc a plain `source` wants.
        apt_get(
            "download Debian's packaging of it",
            &["source", "--download-only", "--diff-only", SOURCE_PACKAGE],
        )
        .in_dir(&w(&work)),
        Step::new(
            "check the source and Debian's packaging against their pinned digests",
            "sha256sum",
            &["--check", "--strict", "--quiet", "-"],
        )
        .with_stdin(format!(
            "{TARBALL_SHA256}  {}\n{DEBIAN_TARBALL_SHA256}  {}\n",
            tarball.display(),
            debian_tarball.display()
        )),
        Step::new(
            "unpack the source",
            "tar",
            &["-xf", &w(&tarball), "--strip-components=1", "-C", &w(&src)],
        ),
        Step::new(
            "unpack Debian's fix for broadcast packets",
            "tar",
            &["-xf", &w(&debian_tarball), "-C", &w(&work), DEBIAN_PATCH],
        ),
        Step::new(
            "apply Debian's fix for broadcast packets",
            "patch",
            &[
                "-p1",
                "--forward",
                "-d",
                &w(&src),
                "-i",
                &w(&work.join(DEBIAN_PATCH)),
            ],
        ),
        Step::new(
            "apply microagent's patch for one guest per passt",
            "patch",
            &["-p1", "--forward", "-d", &w(&src)],
        )
        .with_stdin(ONE_GUEST_PATCH.to_owned()),
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
pub fn note(in_use: PasstInUse) -> String {
    let mut why = "ours keeps an idle workspace's network to about 0.5 MiB of memory (another passt takes about 14 MiB)".to_owned();
    match in_use.snapshot {
        Some(d) if d < PASST_FIXED_SNAPSHOT => why.push_str(&format!(
            ", and the passt this host has or would install is a snapshot of {d}, which resets a workspace's TCP connection once the far end has sent nothing for about 24 s"
        )),
        Some(_) => {}
        None => why.push_str(", and no passt package is known to this host's apt"),
    }
    format!("builds passt {VERSION} from Debian 13's source with Debian's fix and microagent's patch (downloads from deb.debian.org, checks pinned digests) and installs it in {INSTALL_DIR}: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ours_at_this_revision_is_enough() {
        let dir = std::env::temp_dir().join(format!(
            "ma-passt-ours-{}",
            base::host::settings::unique_id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let binary = |name: &str, version: &str| {
            let path = dir.join(name);
            std::fs::write(&path, format!("\x7fELF...{version}\0...")).unwrap();
            path
        };
        assert!(is_ours(&binary("ours", VERSION)));
        // Debian's build of the same snapshot, and an older revision of ours.
        assert!(!is_ours(&binary("debian", "0.0~git20250503.587980c")));
        assert!(!is_ours(&binary(
            "older",
            "0.0~git20250503.587980c+microagent0"
        )));
        assert!(!is_ours(&dir.join("missing")));
        let _ = std::fs::remove_dir_all(&dir);
        for snapshot in [Some(20230309), Some(20250503), None] {
            assert!(needed(PasstInUse {
                snapshot,
                ours: false
            }));
        }
        assert!(!needed(PasstInUse {
            snapshot: Some(20250503),
            ours: true
        }));
        let old = note(PasstInUse {
            snapshot: Some(20230309),
            ours: false,
        });
        assert!(old.contains("0.5 MiB") && old.contains("24 s"), "{old}");
        let new = note(PasstInUse {
            snapshot: Some(20250503),
            ours: false,
        });
        assert!(!new.contains("24 s"), "{new}");
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
        let digests = check.stdin.as_deref().unwrap();
        assert!(digests.starts_with(TARBALL_SHA256), "{digests}");
        assert!(digests.contains(DEBIAN_TARBALL_SHA256), "{digests}");
        // Debian's fix, then ours, both after the digests were checked.
        let at = |what: &str| fresh.iter().position(|s| s.what.contains(what)).unwrap();
        assert!(at("pinned digests") < at("apply Debian's fix"));
        assert!(at("apply Debian's fix") < at("apply microagent's patch"));
        assert!(at("apply microagent's patch") < at("build passt"));
        let ours = &fresh[at("apply microagent's patch")];
        assert_eq!(ours.program, "patch");
        assert_eq!(ours.stdin.as_deref(), Some(ONE_GUEST_PATCH));
        let make = &fresh[at("build passt")];
        assert!(
            make.args.contains(&format!("VERSION={VERSION}")),
            "{make:?}"
        );
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
