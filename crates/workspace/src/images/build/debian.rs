//! A Debian root filesystem from packages by mmdebstrap, minbase plus what
//! workspaces need and the packages asked for, from Debian's mirrors. As
//! root: `--mode=root --skip=chroot/mount` into a tree (dpkg chrooted into
//! it, nothing mounted, so nothing is left behind). Without root:
//! `--mode=unshare` in a user namespace of the caller's subordinate ids
//! (`/etc/subuid`, `/etc/subgid`, mapped by `newuidmap`) into a tar, whose
//! owners the conversion records and writes into the image
//! (`base::images::oci::owners`), so files keep root's and the `user`'s
//! ids although the caller cannot own them.

use std::path::Path;
use std::process::Command;

use super::ImageBuildError;

/// The name of the image `setup --with debian` builds (tasks' and
/// repositories' default).
pub const IMAGE: &str = "debian";
/// What every Debian image gets beyond minbase (the agent's tools and
/// what the `debian` image has).
pub const BASE_PACKAGES: &[&str] = &["ca-certificates", "procps", "coreutils", "bash"];
/// Host packages a Debian build runs.
pub const HOST_PACKAGES: &[&str] = &["mmdebstrap", "debian-archive-keyring"];
/// Host packages a build without root runs besides: `newuidmap` and
/// `newgidmap`.
pub const UNSHARE_PACKAGES: &[&str] = &["mmdebstrap", "debian-archive-keyring", "uidmap"];
/// Empties the image's `/etc/resolv.conf` (mmdebstrap copies the host's
/// in, and the host's resolver means nothing in the guest; the agent
/// writes the workspace's at boot).
pub const RESOLV_HOOK: &str =
    "--customize-hook=rm -f \"$1/etc/resolv.conf\" && : > \"$1/etc/resolv.conf\"";
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

/// How mmdebstrap runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// As root, into a tree with its real owners.
    Root,
    /// Without root, in a user namespace of the caller's subordinate ids,
    /// into a tar.
    Unshare,
}

impl Mode {
    /// Root's or a user's.
    pub fn for_this_process() -> Self {
        // SAFETY: geteuid takes nothing and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            Mode::Root
        } else {
            Mode::Unshare
        }
    }

    /// The host packages it runs.
    pub fn host_packages(self) -> &'static [&'static str] {
        match self {
            Mode::Root => HOST_PACKAGES,
            Mode::Unshare => UNSHARE_PACKAGES,
        }
    }

    /// How a plan says it.
    pub fn describe(self) -> &'static str {
        match self {
            Mode::Root => "as root",
            Mode::Unshare => {
                "without root (mmdebstrap --mode=unshare, in your subordinate uids and gids)"
            }
        }
    }

    /// What mmdebstrap writes in `work`: a tree or a tar.
    fn output(self, work: &Path) -> std::path::PathBuf {
        match self {
            Mode::Root => work.join("tree"),
            Mode::Unshare => work.join("rootfs.tar"),
        }
    }
}

/// The mmdebstrap command line that makes `out` (a tree as root, a tar
/// without).
pub fn mmdebstrap_args(suite: &str, packages: &[String], out: &Path, mode: Mode) -> Vec<String> {
    let mode = match mode {
        Mode::Root => "--mode=root",
        Mode::Unshare => "--mode=unshare",
    };
    let mut args = vec![
        mode.to_owned(),
        format!("--variant={VARIANT}"),
        "--skip=chroot/mount".to_owned(),
        "--skip=check/signed-by".to_owned(),
        format!("--include={}", include(packages).join(",")),
        USER_HOOK.to_owned(),
        RESOLV_HOOK.to_owned(),
        "--aptopt=Acquire::Retries \"3\"".to_owned(),
        suite.to_owned(),
        out.display().to_string(),
    ];
    args.extend(sources(suite));
    args
}

/// Ids a build maps: every id Debian's packages use (65536, what
/// `useradd` gives a user).
const SUBORDINATE_IDS: u64 = 65_536;

/// The ranges of a subordinate id file's `text` (`NAME_OR_UID:START:COUNT`
/// lines, plain decimal numbers): (who, start, count).
fn ranges(text: &str) -> impl Iterator<Item = (&str, u64, u64)> {
    let number = |s: &str| {
        (!s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    text.lines().filter_map(move |line| {
        let mut fields = line.trim().split(':');
        let who = fields.next()?;
        let start = number(fields.next()?)?;
        let count = number(fields.next()?)?;
        Some((who, start, count))
    })
}

/// Whether the user `uid` (named `name`) has a whole range in a
/// subordinate id file's `text`.
fn has_range(text: &str, uid: u32, name: Option<&str>) -> bool {
    ranges(text).any(|(who, _, count)| {
        (Some(who) == name || who == uid.to_string()) && count >= SUBORDINATE_IDS
    })
}

/// A range of [`SUBORDINATE_IDS`] past every range in `texts` (the
/// subordinate uid and gid files), from 100000 as `useradd` starts: one
/// that gives no two users the same host ids.
fn free_range(texts: &[&str]) -> (u64, u64) {
    let end = texts
        .iter()
        .flat_map(|t| ranges(t))
        .map(|(_, start, count)| start.saturating_add(count))
        .max()
        .unwrap_or(0)
        .max(100_000);
    let first = end.div_ceil(SUBORDINATE_IDS) * SUBORDINATE_IDS;
    (first, first + SUBORDINATE_IDS - 1)
}

/// The name of the user `uid`, from the system's user database.
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: an all-zero passwd is valid for getpwuid_r to fill.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to a live buffer of the length given; the
    // result points into `buf`, read before it goes.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r set pw_name to a NUL-terminated string in `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

/// Checks a build without root can map its ids: the caller has ranges in
/// `/etc/subuid` and `/etc/subgid`.
pub fn check_unshare() -> Result<(), ImageBuildError> {
    // SAFETY: getuid takes nothing and cannot fail.
    let uid = unsafe { libc::getuid() };
    let name = user_name(uid);
    let files = ["/etc/subuid", "/etc/subgid"];
    let texts = files.map(|f| std::fs::read_to_string(f).unwrap_or_default());
    for (file, text) in files.iter().zip(&texts) {
        if !has_range(text, uid, name.as_deref()) {
            let (first, last) = free_range(&[&texts[0], &texts[1]]);
            return Err(ImageBuildError::NoSubordinateIds {
                user: name.unwrap_or_else(|| uid.to_string()),
                file: (*file).to_owned(),
                free: format!("{first}-{last}"),
            });
        }
    }
    Ok(())
}

/// Makes the root filesystem of a Debian image in `work` (mmdebstrap,
/// then the conversion that makes it bootable, with `base_rootfs`'s init
/// and agent); `work/mmdebstrap.log` gets mmdebstrap's output. Returns
/// the root filesystem file.
pub fn bootstrap_rootfs(
    suite: &str,
    packages: &[String],
    work: &Path,
    base_rootfs: &Path,
    budget: base::images::oci::unpack::Budget,
) -> Result<std::path::PathBuf, ImageBuildError> {
    let mode = Mode::for_this_process();
    let out = mode.output(work);
    bootstrap(suite, packages, &out, &work.join("mmdebstrap.log"), mode)?;
    let rootfs = match mode {
        Mode::Root => base::images::oci::rootfs::convert_tree(work, base_rootfs)?,
        Mode::Unshare => {
            let digest = base::images::oci::layout::file_digest(&out)?;
            let converted = work.join("convert");
            std::fs::create_dir_all(&converted).map_err(|source| ImageBuildError::Io {
                what: format!("creating {}", converted.display()),
                source,
            })?;
            let rootfs = base::images::oci::rootfs::convert_archive(
                &out,
                &digest,
                &converted,
                base_rootfs,
                None,
                budget,
            )?;
            let _ = std::fs::remove_file(&out);
            rootfs
        }
    };
    Ok(rootfs)
}

/// Runs mmdebstrap into `out`; `log` gets its output.
fn bootstrap(
    suite: &str,
    packages: &[String],
    out: &Path,
    log: &Path,
    mode: Mode,
) -> Result<(), ImageBuildError> {
    if mode == Mode::Unshare {
        check_unshare()?;
    }
    let log_file = std::fs::File::create(log).map_err(|source| ImageBuildError::Io {
        what: format!("creating {}", log.display()),
        source,
    })?;
    let err_file = log_file.try_clone().map_err(|source| ImageBuildError::Io {
        what: format!("opening {}", log.display()),
        source,
    })?;
    let status = Command::new("mmdebstrap")
        .args(mmdebstrap_args(suite, packages, out, mode))
        .stdout(log_file)
        .stderr(err_file)
        .status()
        .map_err(|source| ImageBuildError::Io {
            what: "running mmdebstrap".into(),
            source,
        })?;
    if status.success() {
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
            Mode::Root,
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
        assert!(args.contains(&RESOLV_HOOK.to_owned()));
        // Without root: the same, in a user namespace, into a tar.
        let tar = Path::new("/w/rootfs.tar");
        let unshared = mmdebstrap_args("bookworm", &[], tar, Mode::Unshare);
        assert_eq!(unshared[0], "--mode=unshare");
        assert!(unshared.contains(&"/w/rootfs.tar".to_owned()));
        assert_eq!(Mode::Unshare.output(Path::new("/w")), tar);
        assert!(Mode::Unshare.host_packages().contains(&"uidmap"));
    }

    #[test]
    fn subordinate_ranges_are_found_by_name_or_uid() {
        let text = "alice:100000:65536\n1001:165536:65536\nbob:231072:0\n\
                    al:300000:65536\ndave:+400000:65536\neve:500000:1000\n";
        assert!(has_range(text, 1000, Some("alice")));
        assert!(has_range(text, 1001, Some("carol")));
        assert!(!has_range(text, 1002, Some("bob")), "an empty range");
        assert!(!has_range(text, 1003, None));
        assert!(!has_range(text, 1004, Some("alic")), "another's name");
        assert!(!has_range(text, 1005, Some("dave")), "not a plain number");
        assert!(!has_range(text, 1006, Some("eve")), "too few ids");
        assert!(!has_range("alice", 1000, Some("alice")));
        assert!(!has_range("", 0, Some("root")));
        assert_eq!(user_name(0).as_deref(), Some("root"));
    }

    #[test]
    fn the_range_suggested_is_nobody_elses() {
        let uids = "alice:100000:65536\nbob:165536:65536\n";
        let gids = "alice:100000:65536\nbob:165536:70000\n";
        let (first, last) = free_range(&[uids, gids]);
        assert_eq!(last - first + 1, SUBORDINATE_IDS);
        for (_, start, count) in ranges(uids).chain(ranges(gids)) {
            assert!(first >= start + count || last < start, "{first}-{last}");
        }
        assert_eq!(free_range(&["", ""]), (131_072, 196_607));
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
