//! File operations beyond reading, writing and listing, each one call of a
//! front end: make a directory, remove (previewed), move, edit by exact
//! search and replace, read by lines, and find by a glob. Each is the
//! agent's own operation or a few of them; nothing runs a shell in the
//! guest.

use crate::error::{Error, Result};
use crate::guest::files::{FileKind, FileStat, WorkspaceFiles, WriteOptions};
use crate::guest::request::MAX_COLLECTED_BYTES;

/// Most paths `find` returns.
pub const MAX_FOUND: usize = 1000;
/// Most directory entries `find` looks at.
pub const MAX_FIND_VISITS: usize = 20_000;
/// Longest path a find gives (the guest's `PATH_MAX`).
pub(crate) const MAX_FOUND_PATH: usize = 4096;
/// Deepest directory level `find` descends to below its start.
pub const MAX_FIND_DEPTH: usize = 32;

/// What a remove did, or would do.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Removal {
    /// The path.
    pub path: String,
    /// What it was.
    pub kind: FileKind,
    /// Whether it was removed (false for a preview).
    pub removed: bool,
}

/// What an edit did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Edited {
    /// Occurrences replaced.
    pub replacements: usize,
    /// The file's size after.
    pub size: u64,
}

/// Lines of a file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Lines {
    /// The lines, each with its newline (the last may have none).
    pub text: String,
    /// The first line returned (from 1).
    pub start_line: usize,
    /// The last line returned (0 when none was).
    pub end_line: usize,
    /// Lines in the file.
    pub total_lines: usize,
    /// The file's size in bytes.
    pub size: u64,
}

/// What `find` found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Found {
    /// Absolute paths, in directory order, directories first visited first.
    pub paths: Vec<String>,
    /// Cut short at [`MAX_FOUND`] matches or [`MAX_FIND_VISITS`] entries.
    pub truncated: bool,
}

/// A server's find answer held to what a find here gives: at most
/// [`MAX_FOUND`] paths, each under `dir` and a path a guest can have.
fn check_found(
    server: &str,
    dir: &str,
    found: Found,
) -> std::result::Result<Found, crate::servers::ServerError> {
    let prefix = format!("{}/", dir.trim_end_matches('/'));
    let odd = found
        .paths
        .iter()
        .any(|p| p.len() > MAX_FOUND_PATH || !p.starts_with(&prefix));
    if found.paths.len() > MAX_FOUND || odd {
        return Err(crate::servers::ServerError::Garbled {
            server: server.to_owned(),
            detail: format!(
                "its find answer has {} paths (at most {MAX_FOUND}, each under {dir} and at most {MAX_FOUND_PATH} bytes)",
                found.paths.len()
            ),
        });
    }
    Ok(found)
}

/// Occurrences of `needle` in `hay`, not overlapping.
fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

/// The lines `start..=end` (from 1; `end` past the last line is the last)
/// of `text`.
fn slice_lines(text: &str, start: usize, end: Option<usize>) -> Lines {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let total = lines.len();
    let end = end.unwrap_or(total).min(total);
    let first = start.max(1);
    let picked = if first > end {
        String::new()
    } else {
        lines[first - 1..end].concat()
    };
    Lines {
        text: picked,
        start_line: first,
        end_line: if first > end { 0 } else { end },
        total_lines: total,
        size: text.len() as u64,
    }
}

/// Joins a guest directory and an entry name.
fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

impl WorkspaceFiles<'_> {
    /// Makes a guest directory and its missing parents.
    pub async fn mkdir(self, path: &str) -> Result<()> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::Mkdir {
                    path: path.to_owned(),
                })
                .await?);
        }
        self.ws
            .agent()
            .await?
            .mkdir(path)
            .await
            .map_err(Error::agent("mkdir"))
    }

    /// Removes a guest file, link or empty directory, or with `recursive`
    /// a directory and what it holds; `preview` only says what it would
    /// remove. A missing path is NOT_FOUND.
    pub async fn remove(self, path: &str, recursive: bool, preview: bool) -> Result<Removal> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::Remove {
                    path: path.to_owned(),
                    recursive,
                    preview,
                })
                .await?);
        }
        let stat = self.stat(path).await?;
        if stat.kind == FileKind::Dir && !recursive && !preview {
            let listing = self.list_dir(path).await?;
            if !listing.entries.is_empty() {
                return Err(Error::InvalidInput(format!(
                    "{path} is a directory that is not empty; remove it with recursive"
                )));
            }
        }
        if !preview {
            self.ws
                .agent()
                .await?
                .remove(path, recursive)
                .await
                .map_err(Error::agent("remove"))?;
        }
        Ok(Removal {
            path: path.to_owned(),
            kind: stat.kind,
            removed: !preview,
        })
    }

    /// Moves (renames) a guest path; an existing file at `to` is replaced.
    pub async fn rename(self, from: &str, to: &str) -> Result<()> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::Rename {
                    from: from.to_owned(),
                    to: to.to_owned(),
                })
                .await?);
        }
        self.ws
            .agent()
            .await?
            .rename(from, to)
            .await
            .map_err(Error::agent("rename"))
    }

    /// Replaces `old` with `new` in a guest text file, when it occurs
    /// exactly `expected` times (not overlapping); otherwise nothing
    /// changes and the error says how many there are. Its mode stays.
    /// `preview` checks the same and writes nothing (the size is what it
    /// would be).
    pub async fn edit_file(
        self,
        path: &str,
        old: &str,
        new: &str,
        expected: usize,
        preview: bool,
    ) -> Result<Edited> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::EditFile {
                    path: path.to_owned(),
                    old: old.to_owned(),
                    new: new.to_owned(),
                    expected,
                    preview,
                })
                .await?);
        }
        if old.is_empty() {
            return Err(Error::InvalidInput(
                "the text to replace is empty; give some".into(),
            ));
        }
        let stat: FileStat = self.stat(path).await?;
        if stat.kind != FileKind::File {
            return Err(Error::InvalidInput(format!("{path} is not a regular file")));
        }
        if stat.size > MAX_COLLECTED_BYTES {
            return Err(Error::InvalidInput(format!(
                "{path} has {} bytes; edits take files of at most {MAX_COLLECTED_BYTES}",
                stat.size
            )));
        }
        let read = self.read_file(path, None, None).await?;
        let text = String::from_utf8(read.data)
            .map_err(|_| Error::InvalidInput(format!("{path} is not UTF-8 text")))?;
        let found = count(&text, old);
        if found != expected {
            return Err(Error::EditMismatch {
                path: path.to_owned(),
                expected,
                found,
            });
        }
        let edited = text.replace(old, new);
        if preview {
            return Ok(Edited {
                replacements: found,
                size: edited.len() as u64,
            });
        }
        let size = self
            .write_file(
                path,
                edited.as_bytes(),
                WriteOptions {
                    append: false,
                    perm: Some(stat.mode),
                },
            )
            .await?;
        Ok(Edited {
            replacements: found,
            size,
        })
    }

    /// Lines `start_line..=end_line` (from 1; default: to the end) of a
    /// guest text file of at most [`MAX_COLLECTED_BYTES`].
    pub async fn read_lines(
        self,
        path: &str,
        start_line: usize,
        end_line: Option<usize>,
    ) -> Result<Lines> {
        if let Some(remote) = self.ws.remote()? {
            return Ok(remote
                .call(crate::servers::WorkspaceCall::ReadLines {
                    path: path.to_owned(),
                    start_line,
                    end_line,
                })
                .await?);
        }
        if start_line == 0 || end_line.is_some_and(|e| e < start_line) {
            return Err(Error::InvalidInput(
                "lines count from 1, and end_line is not before start_line".into(),
            ));
        }
        let read = self.read_file(path, None, None).await?;
        if read.size > read.data.len() as u64 {
            return Err(Error::InvalidInput(format!(
                "{path} has {} bytes; reading by lines takes files of at most {MAX_COLLECTED_BYTES} (read by bytes instead)",
                read.size
            )));
        }
        let text = String::from_utf8(read.data)
            .map_err(|_| Error::InvalidInput(format!("{path} is not UTF-8 text")))?;
        Ok(slice_lines(&text, start_line, end_line))
    }

    /// Paths under the guest directory `dir` matching `pattern`: a pattern
    /// without `/` matches entry names at any depth (`*.png`), one with
    /// `/` matches paths relative to `dir` (`src/**/*.rs`). Links are not
    /// followed; bounded by [`MAX_FOUND`], [`MAX_FIND_VISITS`] and
    /// [`MAX_FIND_DEPTH`].
    pub async fn find(self, dir: &str, pattern: &str) -> Result<Found> {
        if let Some(remote) = self.ws.remote()? {
            let found: Found = remote
                .call(crate::servers::WorkspaceCall::Find {
                    dir: dir.to_owned(),
                    pattern: pattern.to_owned(),
                })
                .await?;
            return Ok(check_found(remote.server(), dir, found)?);
        }
        let glob = glob::Pattern::new(pattern)
            .map_err(|e| Error::InvalidInput(format!("pattern `{pattern}`: {e}")))?;
        let by_name = !pattern.contains('/');
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: !pattern.contains("**"),
            require_literal_leading_dot: false,
        };
        let mut found = Found {
            paths: Vec::new(),
            truncated: false,
        };
        let mut visits = 0usize;
        // (absolute directory, path relative to `dir`, depth)
        let mut pending = vec![(dir.to_owned(), String::new(), 0usize)];
        while let Some((abs, rel, depth)) = pending.pop() {
            let (entries, cut) = self
                .ws
                .agent()
                .await?
                .list_dir(&abs)
                .await
                .map_err(Error::agent("list_dir"))?;
            found.truncated |= cut;
            let mut subdirs = Vec::new();
            for entry in entries {
                visits += 1;
                if visits > MAX_FIND_VISITS || found.paths.len() >= MAX_FOUND {
                    found.truncated = true;
                    return Ok(found);
                }
                let rel_path = if rel.is_empty() {
                    entry.name.clone()
                } else {
                    format!("{rel}/{}", entry.name)
                };
                let subject = if by_name { &entry.name } else { &rel_path };
                if glob.matches_with(subject, options) {
                    found.paths.push(join(&abs, &entry.name));
                }
                let is_dir = matches!(FileKind::from(entry.kind), FileKind::Dir);
                if is_dir && depth < MAX_FIND_DEPTH {
                    subdirs.push((join(&abs, &entry.name), rel_path, depth + 1));
                }
            }
            // Depth first, in listing order.
            pending.extend(subdirs.into_iter().rev());
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_find_answer_is_held_to_what_a_find_here_gives() {
        let found = |paths: Vec<String>| Found {
            paths,
            truncated: false,
        };
        let ok = found(vec!["/out/a.png".into(), "/out/sub/b.png".into()]);
        assert_eq!(check_found("s", "/out/", ok.clone()).unwrap(), ok);
        for bad in [
            found(vec!["/etc/passwd".into()]),
            found(vec!["/outside".into()]),
            found(vec![format!("/out/{}", "x".repeat(MAX_FOUND_PATH))]),
            found((0..=MAX_FOUND).map(|i| format!("/out/{i}")).collect()),
        ] {
            let err = check_found("s", "/out", bad).unwrap_err();
            assert!(
                matches!(err, crate::servers::ServerError::Garbled { .. }),
                "{err}"
            );
        }
    }

    #[test]
    fn occurrences_are_counted_without_overlap() {
        assert_eq!(count("aaaa", "aa"), 2);
        assert_eq!(count("x = 1; x = 2", "x = "), 2);
        assert_eq!(count("abc", "d"), 0);
    }

    #[test]
    fn lines_are_sliced_from_one_and_clamped() {
        let text = "one\ntwo\nthree";
        let l = slice_lines(text, 2, Some(3));
        assert_eq!(
            (l.text.as_str(), l.start_line, l.end_line),
            ("two\nthree", 2, 3)
        );
        assert_eq!(l.total_lines, 3);
        let l = slice_lines(text, 1, None);
        assert_eq!(l.text, text);
        let l = slice_lines(text, 3, Some(99));
        assert_eq!((l.text.as_str(), l.end_line), ("three", 3));
        let past = slice_lines(text, 5, None);
        assert_eq!((past.text.as_str(), past.end_line), ("", 0));
        assert_eq!(slice_lines("", 1, None).total_lines, 0);
    }

    #[test]
    fn guest_paths_join_once() {
        assert_eq!(join("/", "etc"), "/etc");
        assert_eq!(join("/srv", "app"), "/srv/app");
        assert_eq!(join("/srv/", "app"), "/srv/app");
    }
}
