//! Files a command leaves behind, brought back with its result: each
//! `outputs` pattern is an absolute guest path, or one with a glob from
//! some component on (`/out/*.png`, `/out/**/*.csv`), matched after the
//! command. Matched files are read back whole up to a cap each and in all;
//! past it only their size is given, so a caller copies them out instead.
//! [`Workspace::collect_outputs`] keeps such files on the host, under the
//! quotas of [`base::store::kept_outputs`].

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::guest::files::check_guest_path;
use crate::guest::FileKind;
use crate::host::host_write::{Budgeted, TempFile};
use crate::workspaces::handle::Workspace;
use base::store::kept_outputs::{KeepCall, KeptOutputs, SparseWriter};

/// Most patterns one call takes.
pub const MAX_OUTPUT_PATTERNS: usize = 16;
/// Most files one call brings back.
pub const MAX_OUTPUT_FILES: usize = 32;
/// Largest file read back whole.
pub const OUTPUT_FILE_CAP: u64 = 1 << 20;
/// Most bytes read back whole in all.
pub const OUTPUT_TOTAL_CAP: u64 = 8 << 20;
/// Most matched paths one call looks at (a `stat` each).
pub const MAX_OUTPUT_STATS: usize = 256;

/// One matched file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputFile {
    /// Its absolute guest path.
    pub path: String,
    /// Its size.
    pub size: u64,
    /// Its media type, from its name (`image/png`, `text/plain`, ...).
    pub mime: &'static str,
    /// Its bytes, when within [`OUTPUT_FILE_CAP`] and the total cap.
    pub data: Option<Vec<u8>>,
    /// Where a file past the caps was copied on the host (by
    /// [`Workspace::collect_outputs`]).
    pub kept: Option<PathBuf>,
}

/// What the patterns matched.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outputs {
    /// The files, in pattern order.
    pub files: Vec<OutputFile>,
    /// Patterns that matched no regular file.
    pub unmatched: Vec<String>,
    /// More matched than [`MAX_OUTPUT_FILES`] files (or than
    /// [`MAX_OUTPUT_STATS`] paths); the rest were left.
    pub truncated: bool,
}

/// Checks `patterns`: at most [`MAX_OUTPUT_PATTERNS`], each absolute and a
/// valid glob.
pub fn check_patterns(patterns: &[String]) -> Result<()> {
    if patterns.len() > MAX_OUTPUT_PATTERNS {
        return Err(Error::InvalidInput(format!(
            "{} output patterns; at most {MAX_OUTPUT_PATTERNS}",
            patterns.len()
        )));
    }
    for p in patterns {
        check_guest_path(p)?;
        if p.split('/').any(|c| c == "..") {
            return Err(Error::InvalidInput(format!(
                "output pattern {p:?}: `..` is not allowed"
            )));
        }
        glob::Pattern::new(p)
            .map_err(|e| Error::InvalidInput(format!("output pattern {p:?}: {e}")))?;
    }
    Ok(())
}

/// `(directory, glob below it)` of a pattern with glob characters, or
/// `None` for a plain path.
fn split_pattern(pattern: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = pattern.split('/').collect();
    let first = parts.iter().position(|c| c.contains(['*', '?', '[']))?;
    let dir = parts[..first].join("/");
    let dir = if dir.is_empty() { "/".to_owned() } else { dir };
    Some((dir, parts[first..].join("/")))
}

/// The media type of `path` by its extension.
pub fn mime_of(path: &str) -> &'static str {
    let ext = Path::new(path)
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("svg") => "image/svg+xml",
        Some("json") => "application/json",
        Some("html" | "htm") => "text/html",
        Some("csv") => "text/csv",
        Some("md") => "text/markdown",
        Some(
            "txt" | "log" | "py" | "rs" | "js" | "ts" | "sh" | "toml" | "yaml" | "yml" | "c" | "h"
            | "go" | "java" | "xml",
        ) => "text/plain",
        _ => "application/octet-stream",
    }
}

impl Workspace<'_> {
    /// The regular files `patterns` match now, with sizes; data is not read.
    pub async fn match_outputs(self, patterns: &[String]) -> Result<Outputs> {
        check_patterns(patterns)?;
        let mut out = Outputs::default();
        let mut stats = 0;
        for pattern in patterns {
            let mut paths = Vec::new();
            match split_pattern(pattern) {
                None => paths.push(pattern.clone()),
                Some((dir, rest)) => {
                    let found = match self.files().find(&dir, &rest).await {
                        Ok(found) => found,
                        Err(e) if e.code() == base::code::ErrorCode::NotFound => {
                            out.unmatched.push(pattern.clone());
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    // A name pattern matches in `dir` only, not below.
                    let prefix = format!("{}/", dir.trim_end_matches('/'));
                    paths.extend(found.paths.into_iter().filter(|p| {
                        rest.contains('/')
                            || p.strip_prefix(&prefix).is_some_and(|r| !r.contains('/'))
                    }));
                }
            }
            let before = out.files.len();
            for path in paths {
                if out.files.iter().any(|f| f.path == path) {
                    continue;
                }
                // Each candidate costs a round trip (over SSH for a
                // workspace on a server): a guest that makes directories
                // match cannot make a collection take thousands.
                if stats == MAX_OUTPUT_STATS {
                    out.truncated = true;
                    break;
                }
                stats += 1;
                let stat = match self.files().stat(&path).await {
                    Ok(s) => s,
                    Err(e) if e.code() == base::code::ErrorCode::NotFound => continue,
                    Err(e) => return Err(e),
                };
                if stat.kind != FileKind::File {
                    continue;
                }
                if out.files.len() == MAX_OUTPUT_FILES {
                    out.truncated = true;
                    break;
                }
                out.files.push(OutputFile {
                    mime: mime_of(&path),
                    path,
                    size: stat.size,
                    data: None,
                    kept: None,
                });
            }
            // A pattern left unlooked at (the calls ran out) is not said
            // to match nothing.
            if out.files.len() == before && !out.truncated {
                out.unmatched.push(pattern.clone());
            }
        }
        Ok(out)
    }

    /// [`Workspace::match_outputs`] with each file's bytes read back while
    /// within [`OUTPUT_FILE_CAP`] and [`OUTPUT_TOTAL_CAP`]; a file past
    /// them is copied to the host (holes kept as holes) into
    /// `<state>/outputs/<workspace>/<call>/`, so it outlives a one-shot,
    /// under the kept outputs' quotas: a call over one keeps nothing and
    /// fails. What is past its TTL is swept first. For a workspace on a
    /// server the files come from there, by the same calls.
    pub async fn collect_outputs(self, patterns: &[String]) -> Result<Outputs> {
        let mut out = self.match_outputs(patterns).await?;
        let kept = KeptOutputs::new(self.all.state_dir().root())?;
        kept.sweep();
        // Removes what it kept when dropped before it is finished.
        let mut call = kept.begin(self.name.as_str());
        let mut total = 0u64;
        for (index, file) in out.files.iter_mut().enumerate() {
            let inline = file.size <= OUTPUT_FILE_CAP && total + file.size <= OUTPUT_TOTAL_CAP;
            if inline {
                // At most what the caps leave, whatever size it had when
                // matched: it may have grown since (or a server said less).
                let room = OUTPUT_FILE_CAP.min(OUTPUT_TOTAL_CAP - total);
                let read = self.files().read_file(&file.path, None, Some(room)).await?;
                if read.size <= read.data.len() as u64 {
                    file.size = read.data.len() as u64;
                    total += file.size;
                    file.data = Some(read.data);
                    continue;
                }
                file.size = read.size;
            }
            let to = call.path_for(&format!("{index}-{}", kept_name(&file.path)))?;
            file.size = self
                .keep_file(&file.path, file.size, &to, &mut call)
                .await?;
            file.kept = Some(to);
        }
        if let Some(dir) = call.finish()? {
            // Where they are kept now that the call finished.
            for file in &mut out.files {
                if let Some(name) = file.kept.as_deref().and_then(Path::file_name) {
                    file.kept = Some(dir.join(name));
                }
            }
        }
        Ok(out)
    }

    /// Copies guest file `path` (`size` bytes when matched) to `to`, holes
    /// kept, within the room `call` has left, readable and writable only
    /// (no mode bit of the guest's makes it a program here); counts it in
    /// `call`. Returns its length.
    async fn keep_file(self, path: &str, size: u64, to: &Path, call: &mut KeepCall) -> Result<u64> {
        if let Some(remote) = self.remote()? {
            return keep_remote_file(&remote, path, size, to, call, self.all.limits()).await;
        }
        let (room, quota) = call.room();
        let mut tmp = TempFile::beside(to)?;
        let file = tmp
            .file()
            .try_clone()
            .map_err(Error::host_io(format!("opening {} again", to.display())))?;
        // What the guest may stream (time, not disk), as a copy out takes.
        let budget = crate::guest::copy::file_budget(size, self.all.limits());
        let mut writer = Budgeted::new(SparseSink(SparseWriter::new(file, room)), budget);
        let got = self
            .agent()
            .await?
            .read_file_to(path, None, None, &mut writer)
            .await;
        let (exhausted, streamed_over) = (writer.exhausted(), writer.over());
        let SparseSink(mut sparse) = writer.into_inner();
        let over_quota = |sparse: &SparseWriter| call.over(quota.clone(), sparse.written() + 1);
        let header = match got {
            Ok(h) => h,
            Err(_) if sparse.over() => return Err(over_quota(&sparse).into()),
            Err(_) if exhausted => return Err(streamed_over.into()),
            Err(e) => return Err(Error::agent("read_file")(e)),
        };
        let length = match sparse.finish() {
            Ok(length) => length,
            Err(_) if sparse.over() => return Err(over_quota(&sparse).into()),
            Err(e) => return Err(Error::host_io(format!("writing {}", to.display()))(e)),
        };
        tmp.persist(header.mode & KEPT_MODE_BITS, to)?;
        call.add(to)?;
        Ok(length)
    }
}

/// A kept output file as the agent's reader writes it: plain file writes
/// that land in the page cache, as `host_write`'s unpacking does in the
/// same async calls.
struct SparseSink(SparseWriter);

impl tokio::io::AsyncWrite for SparseSink {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(self.0.take(buf))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// [`Workspace::keep_file`] for a workspace on a server: its bytes come
/// as a copy out does (holes are not kept), at most the room `call` has
/// left, so a file over a quota is refused before or while it comes.
async fn keep_remote_file(
    remote: &crate::servers::RemoteWorkspace,
    path: &str,
    size: u64,
    to: &Path,
    call: &mut KeepCall,
    limits: &base::store::spec::Limits,
) -> Result<u64> {
    let (room, quota) = call.room();
    if size > room {
        return Err(call.over(quota, size).into());
    }
    let budget = crate::guest::copy::file_budget(size, limits).min(room);
    let mut tmp = TempFile::beside(to)?;
    let sent = match crate::guest::copy::fetch(remote, path, false, budget, tmp.file()).await {
        Ok(sent) => sent,
        Err(Error::HostWrite(crate::host::host_write::HostWriteError::OverBudget { .. }))
            if budget == room =>
        {
            return Err(call.over(quota, room.saturating_add(1)).into());
        }
        Err(e) => return Err(e),
    };
    tmp.persist(sent.mode & KEPT_MODE_BITS, to)?;
    call.add(to)?;
    Ok(sent.bytes)
}

/// The mode bits a kept file keeps of its guest file's: read and write.
const KEPT_MODE_BITS: u32 = 0o666;

/// Longest part of a guest file's name a kept file's name takes, bytes:
/// with its index and a temporary's marks it stays a valid file name.
const KEPT_NAME_BYTES: usize = 128;

/// The name a kept copy of guest file `path` takes (after its index): the
/// file's own name, cut at a character boundary.
fn kept_name(path: &str) -> String {
    let name = Path::new(path)
        .file_name()
        .map_or("file".into(), |n| n.to_string_lossy().into_owned());
    let mut end = name.len().min(KEPT_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_split_at_their_first_glob() {
        assert_eq!(split_pattern("/out/report.txt"), None);
        assert_eq!(
            split_pattern("/out/*.png"),
            Some(("/out".into(), "*.png".into()))
        );
        assert_eq!(
            split_pattern("/out/**/*.csv"),
            Some(("/out".into(), "**/*.csv".into()))
        );
        assert_eq!(split_pattern("/*.txt"), Some(("/".into(), "*.txt".into())));
    }

    #[test]
    fn bad_patterns_are_refused() {
        let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_patterns(&p(&["/out/*.png", "/a.txt"])).is_ok());
        for bad in [&["out/*.png"][..], &["/a/../etc/passwd"], &["/out/[.png"]] {
            assert_eq!(
                check_patterns(&p(bad)).unwrap_err().code(),
                base::code::ErrorCode::InvalidInput,
                "{bad:?}"
            );
        }
        let many: Vec<String> = (0..17).map(|i| format!("/f{i}")).collect();
        assert!(check_patterns(&many).is_err());
    }

    #[test]
    fn a_kept_files_name_is_cut_at_a_character_boundary() {
        assert_eq!(kept_name("/out/report.txt"), "report.txt");
        assert_eq!(kept_name("/"), "file");
        let long = format!("/out/{}", "é".repeat(200));
        let name = kept_name(&long);
        assert!(name.len() <= KEPT_NAME_BYTES && name.len() >= KEPT_NAME_BYTES - 1);
        assert!(name.chars().all(|c| c == 'é'));
    }

    #[test]
    fn media_types_come_from_names() {
        assert_eq!(mime_of("/o/plot.PNG"), "image/png");
        assert_eq!(mime_of("/o/a.svg"), "image/svg+xml");
        assert_eq!(mime_of("/o/a.txt"), "text/plain");
        assert_eq!(mime_of("/o/blob"), "application/octet-stream");
    }
}
