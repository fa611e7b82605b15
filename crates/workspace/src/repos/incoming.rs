//! What a guest's commits may do to the host before any of it is written:
//! its bundle is held to a size and an object count (read from the pack
//! header, before `index-pack` inflates anything), and a checkout of its
//! tree into a host work tree to a byte and a file count (summed from the
//! trees), to paths that replace no untracked or ignored file and lie
//! under no `.git`. Limits come from `config.json`'s `repos` object.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::Deserialize;

use crate::repos::git::{self, GitError};
use base::host_tool::HostToolError;

/// The `config.json` object with these limits.
pub const CONFIG_KEY: &str = "repos";

/// Bounds on what a guest's commits may bring (`config.json` `repos`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RepoLimits {
    /// Bytes a checkout may write (the sizes of the files it adds or
    /// changes): 1 GiB.
    pub max_checkout_bytes: u64,
    /// Files a task's tree may hold: 200,000.
    pub max_checkout_files: u64,
    /// Size of a bundle: 1 GiB.
    pub max_bundle_bytes: u64,
    /// Objects in a bundle: 1,000,000.
    pub max_bundle_objects: u64,
}

impl Default for RepoLimits {
    fn default() -> Self {
        Self {
            max_checkout_bytes: 1 << 30,
            max_checkout_files: 200_000,
            max_bundle_bytes: 1 << 30,
            max_bundle_objects: 1_000_000,
        }
    }
}

impl RepoLimits {
    /// The limits of the state directory at `root` (defaults where unset).
    pub fn load(root: &Path) -> Result<Self, String> {
        base::host::settings::config_section(root, CONFIG_KEY)
            .map(|s| s.map(|(limits, _)| limits).unwrap_or_default())
            .map_err(|e| base::error_chain::error_chain(&e))
    }
}

/// Why a bundle is not taken: the words of a refusal.
pub(crate) fn check_bundle(file: &Path, limits: &RepoLimits) -> Result<(), String> {
    let mut f = std::fs::File::open(file).map_err(|e| format!("opening the bundle: {e}"))?;
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    if size > limits.max_bundle_bytes {
        return Err(format!(
            "the bundle is {size} bytes, over the limit of {} (config.json repos.max_bundle_bytes)",
            limits.max_bundle_bytes
        ));
    }
    let objects = pack_objects(&mut f).ok_or("the bundle is not a git bundle with a pack")?;
    if objects > limits.max_bundle_objects {
        return Err(format!(
            "the bundle holds {objects} objects, over the limit of {} (config.json repos.max_bundle_objects)",
            limits.max_bundle_objects
        ));
    }
    Ok(())
}

/// The object count in a bundle's pack header: the header lines (at most
/// 1 MiB of them), a blank line, then `PACK`, version, count.
fn pack_objects(file: &mut impl Read) -> Option<u64> {
    let mut reader = BufReader::new(file.take(1 << 20));
    let mut line = Vec::new();
    let mut first = true;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        if first && !line.starts_with(b"# v2 git bundle") && !line.starts_with(b"# v3 git bundle") {
            return None;
        }
        first = false;
        if line == b"\n" {
            break;
        }
    }
    let mut head = [0u8; 12];
    reader.read_exact(&mut head).ok()?;
    if &head[..4] != b"PACK" {
        return None;
    }
    Some(u64::from(u32::from_be_bytes([
        head[8], head[9], head[10], head[11],
    ])))
}

/// One blob or link of a tree: its mode, id and size.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    mode: String,
    id: String,
    size: u64,
}

/// A listing's output, or the refusal's words when it is past the
/// runner's bound (`what` says what it lists).
fn bounded_output(
    listing: base::host_tool::HostTool,
    repo: &Path,
    what: &str,
) -> Result<Result<Vec<u8>, String>, GitError> {
    let bound = listing.current_limits().output_bytes;
    match git::output_bytes(listing, repo) {
        Err(GitError::Tool {
            source: HostToolError::OutputTooLarge { .. },
            ..
        }) => Ok(Err(format!("there are more than {bound} bytes {what}"))),
        other => other.map(Ok),
    }
}

/// `rev`'s tree as path -> entry (`-z` listing, bounded in bytes by the
/// runner and in count by `limits`).
fn tree(
    repo: &Path,
    rev: &str,
    limits: &RepoLimits,
) -> Result<Result<HashMap<Vec<u8>, Entry>, String>, GitError> {
    let listing = git::git(repo, ["ls-tree", "-r", "-l", "-z", "--full-tree", rev])?;
    let out = match bounded_output(listing, repo, "of file names in its tree")? {
        Ok(out) => out,
        Err(why) => return Ok(Err(why)),
    };
    let mut entries = HashMap::new();
    for record in out.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        // `<mode> SP <type> SP <id> SP+ <size> TAB <path>`
        let Some(tab) = record.iter().position(|b| *b == b'\t') else {
            continue;
        };
        let (meta, path) = (&record[..tab], &record[tab + 1..]);
        let meta = String::from_utf8_lossy(meta);
        let mut words = meta.split_whitespace();
        let (Some(mode), Some(_kind), Some(id), Some(size)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        entries.insert(
            path.to_vec(),
            Entry {
                mode: mode.to_owned(),
                id: id.to_owned(),
                size: size.parse().unwrap_or(0),
            },
        );
        if entries.len() as u64 > limits.max_checkout_files {
            return Ok(Err(format!(
                "its tree holds more than {} files (config.json repos.max_checkout_files)",
                limits.max_checkout_files
            )));
        }
    }
    Ok(Ok(entries))
}

/// Checks what replaying the commits of `base..tip` one by one writes (a
/// rebase checks out each; a commit may add a gigabyte and the next remove
/// it): the sum of the blobs each adds or changes, held to the checkout
/// limit. The refusal's words, or Ok.
pub(crate) fn check_commits(
    repo: &Path,
    base: &str,
    tip: &str,
    limits: &RepoLimits,
) -> Result<Result<(), String>, GitError> {
    let range = format!("{base}..{tip}");
    let log = git::git(
        repo,
        [
            "log",
            "--no-renames",
            "--raw",
            "-z",
            "--no-abbrev",
            "--format=",
            &range,
        ],
    )?;
    let out = match bounded_output(log, repo, "of changes in its commits")? {
        Ok(out) => out,
        Err(why) => return Ok(Err(why)),
    };
    // `:<mode> <mode> <id> <id> <status>` NUL `<path>` NUL, per change.
    let mut written: Vec<String> = Vec::new();
    for record in out.split(|b| *b == 0) {
        let Some(meta) = record.strip_prefix(b":") else {
            continue;
        };
        let meta = String::from_utf8_lossy(meta);
        let words: Vec<&str> = meta.split_whitespace().collect();
        if let [_, new_mode, _, new_id, status] = words[..] {
            // Deletions write nothing; gitlinks are no files.
            if !status.starts_with('D') && new_mode != "160000" {
                written.push(new_id.to_owned());
            }
        }
    }
    if written.is_empty() {
        return Ok(Ok(()));
    }
    let mut sizes = git::git(repo, ["cat-file", "--batch-check=%(objectsize)"])?
        .spawn(std::process::Stdio::piped())
        .map_err(|source| GitError::Tool {
            what: "cat-file".into(),
            source,
        })?;
    if let Some(mut stdin) = sizes.stdin() {
        use std::io::Write;
        let ids: String = written.iter().map(|id| format!("{id}\n")).collect();
        // A write that fails means cat-file ended; finish says why.
        let _ = stdin.write_all(ids.as_bytes());
    }
    let out = sizes.finish().map_err(|source| GitError::Tool {
        what: "cat-file".into(),
        source,
    })?;
    let factor = match tree(repo, tip, limits)? {
        Ok(t) => expansion(repo, &t)?,
        Err(why) => return Ok(Err(why)),
    };
    let mut bytes: u64 = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let size: u64 = line.trim().parse().unwrap_or(0);
        bytes = bytes.saturating_add(size.saturating_mul(factor));
    }
    if bytes > limits.max_checkout_bytes {
        return Ok(Err(format!(
            "replaying its commits would write {bytes} bytes, more than {} (config.json repos.max_checkout_bytes)",
            limits.max_checkout_bytes
        )));
    }
    Ok(Ok(()))
}

/// Most bytes of one attributes file read.
const MAX_ATTRIBUTES_BYTES: usize = 1 << 20;

/// How much bigger than its blob a file may be once checked out, by the
/// attributes that apply (the tree's `.gitattributes` files and the
/// repository's `info/attributes`; the user's global file is not read by
/// the runner's git, `core.attributesFile=/dev/null`): `ident` turns each
/// 4-byte `$Id$` into 47 bytes, a `working-tree-encoding` up to 4 bytes a
/// character, `crlf` 2 a newline. Read as words anywhere in the text, so
/// a comment errs on the side of refusing.
fn expansion(repo: &Path, tree: &HashMap<Vec<u8>, Entry>) -> Result<u64, GitError> {
    let mut texts: Vec<Vec<u8>> = Vec::new();
    for (path, entry) in tree {
        if path == b".gitattributes" || path.ends_with(b"/.gitattributes") {
            let show = git::git(repo, ["cat-file", "blob", &entry.id])?.limits(
                base::host_tool::ToolLimits {
                    output_bytes: MAX_ATTRIBUTES_BYTES,
                    ..base::host_tool::ToolLimits::default()
                },
            );
            match git::output_bytes(show, repo) {
                Ok(text) => texts.push(text),
                // Past the bound: assume the worst.
                Err(GitError::Tool {
                    source: HostToolError::OutputTooLarge { .. },
                    ..
                }) => texts.push(b"ident working-tree-encoding crlf".to_vec()),
                Err(e) => return Err(e),
            }
        }
    }
    let info = git::run(repo, ["rev-parse", "--git-path", "info/attributes"])?;
    let info = repo.join(info);
    if let Ok(file) = std::fs::File::open(&info) {
        let mut text = Vec::new();
        let _ = file
            .take(MAX_ATTRIBUTES_BYTES as u64)
            .read_to_end(&mut text);
        texts.push(text);
    }
    let has = |word: &[u8]| {
        texts
            .iter()
            .any(|t| t.windows(word.len()).any(|w| w == word))
    };
    let mut factor = 1;
    if has(b"ident") {
        factor *= 12;
    }
    if has(b"working-tree-encoding") {
        factor *= 4;
    }
    if has(b"crlf") {
        factor *= 2;
    }
    Ok(factor)
}

/// Whether a tree path has a `.git` component (as git and the file systems
/// it protects against read it: any case, trailing dots and spaces off),
/// or a `.` or `..` one.
fn names_git_dir(path: &[u8]) -> bool {
    path.split(|b| *b == b'/').any(|part| {
        let trimmed = part
            .iter()
            .rposition(|b| *b != b'.' && *b != b' ')
            .map_or(&part[..0], |end| &part[..=end]);
        trimmed.eq_ignore_ascii_case(b".git") || part == b"." || part == b".." || part.is_empty()
    })
}

/// Checks a checkout that moves `worktree` (or a fresh directory, when
/// None) from `from` (None: nothing checked out) to `to`: the refusal's
/// words, or Ok when it may go ahead.
pub(crate) fn check_checkout(
    repo: &Path,
    worktree: Option<&Path>,
    from: Option<&str>,
    to: &str,
    limits: &RepoLimits,
) -> Result<Result<(), String>, GitError> {
    let new = match tree(repo, to, limits)? {
        Ok(t) => t,
        Err(why) => return Ok(Err(why)),
    };
    let old = match from {
        Some(rev) => match tree(repo, rev, limits)? {
            Ok(t) => t,
            Err(why) => return Ok(Err(why)),
        },
        None => HashMap::new(),
    };
    let old_dirs: HashSet<&[u8]> = old
        .keys()
        .flat_map(|p| {
            p.iter()
                .enumerate()
                .filter(|(_, b)| **b == b'/')
                .map(move |(i, _)| &p[..i])
        })
        .collect();
    let factor = expansion(repo, &new)?;
    let mut bytes: u64 = 0;
    for (path, entry) in &new {
        let shown = String::from_utf8_lossy(path);
        if names_git_dir(path) {
            return Ok(Err(format!("it would write `{shown}`, a path under .git")));
        }
        if old.get(path) == Some(entry) {
            continue;
        }
        bytes = bytes.saturating_add(entry.size.saturating_mul(factor));
        if bytes > limits.max_checkout_bytes {
            return Ok(Err(format!(
                "it would write more than {} bytes (config.json repos.max_checkout_bytes{})",
                limits.max_checkout_bytes,
                if factor > 1 {
                    ", with its attributes' expansion"
                } else {
                    ""
                }
            )));
        }
        let Some(wt) = worktree else { continue };
        if old.contains_key(path) {
            continue;
        }
        if let Some(clash) = untracked_in_the_way(wt, path, &old_dirs) {
            return Ok(Err(format!(
                "it would replace `{clash}`, a file git does not track (untracked or ignored)"
            )));
        }
    }
    Ok(Ok(()))
}

/// A file or link on disk that adding tracked `path` to `wt` would replace:
/// `path` itself, or a leading part of it that is not a directory git
/// tracks files in.
fn untracked_in_the_way(wt: &Path, path: &[u8], tracked_dirs: &HashSet<&[u8]>) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let mut ends: Vec<usize> = path
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'/')
        .map(|(i, _)| i)
        .collect();
    ends.push(path.len());
    for end in ends {
        let part = &path[..end];
        let last = end == path.len();
        if !last && tracked_dirs.contains(part) {
            continue;
        }
        let on_disk = wt.join(std::ffi::OsStr::from_bytes(part));
        match std::fs::symlink_metadata(&on_disk) {
            Err(_) => return None,
            Ok(m) if !last && m.is_dir() => continue,
            Ok(_) => return Some(String::from_utf8_lossy(part).into_owned()),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_dirs_are_seen_in_any_spelling() {
        for p in [
            ".git/hooks/x",
            "a/.GIT/config",
            "a/.git./x",
            "a/.git ",
            "../x",
            "a//b",
        ] {
            assert!(names_git_dir(p.as_bytes()), "{p}");
        }
        for p in [".github/x", ".gitignore", "a/b.git", "x/.gitmodules"] {
            assert!(!names_git_dir(p.as_bytes()), "{p}");
        }
    }

    #[test]
    fn a_bundle_header_gives_its_object_count() {
        let mut bundle = b"# v2 git bundle\nabc HEAD\n\nPACK\0\0\0\x02\0\0\x01\x00rest".to_vec();
        assert_eq!(pack_objects(&mut bundle.as_slice()), Some(256));
        bundle[0] = b'x';
        assert_eq!(pack_objects(&mut bundle.as_slice()), None);
        assert_eq!(pack_objects(&mut &b"# v2 git bundle\n\nPAK"[..]), None);
    }
}
