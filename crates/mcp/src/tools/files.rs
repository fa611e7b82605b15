//! File tools: read, write and list guest files; copy files and directories
//! between host and guest. Writes and copies accept preview: true.

use std::path::{Path, PathBuf};

use base64::Engine;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use workspace::ErrorCode;
use workspace::{FileKind, FileStat};

use super::{guest_path, in_range, would_or_did};
use crate::output::{bytes, Out, ToolResult};
use crate::schema::files::*;
use crate::{MicroagentServer, ToolError};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Parses an octal permission string ("0755", "644").
fn parse_mode(mode: &str) -> Result<u32, ToolError> {
    let bad = || {
        ToolError::InvalidInput(format!(
            "mode {mode:?} is not octal permission bits like \"0644\" or \"0755\""
        ))
    };
    let digits = mode.trim_start_matches("0o");
    if digits.is_empty() || digits.len() > 5 {
        return Err(bad());
    }
    let value = u32::from_str_radix(digits, 8).map_err(|_| bad())?;
    if value > 0o7777 {
        return Err(bad());
    }
    Ok(value)
}

/// The bytes of a read, cut back to whole UTF-8 characters when that makes
/// them text (a read that ends inside a character continues at it).
fn encode(mut data: Vec<u8>, asked: Option<Encoding>, at_eof: bool) -> (Encoding, String, Vec<u8>) {
    match asked {
        Some(Encoding::Base64) => (Encoding::Base64, B64.encode(&data), data),
        Some(Encoding::Utf8) => (
            Encoding::Utf8,
            String::from_utf8_lossy(&data).into_owned(),
            data,
        ),
        None => match std::str::from_utf8(&data) {
            Ok(text) => (Encoding::Utf8, text.to_owned(), data),
            Err(e) if e.error_len().is_none() && !at_eof && e.valid_up_to() > 0 => {
                data.truncate(e.valid_up_to());
                let text = String::from_utf8_lossy(&data).into_owned();
                (Encoding::Utf8, text, data)
            }
            Err(_) => (Encoding::Base64, B64.encode(&data), data),
        },
    }
}

/// Entries (the directory itself included, as copy_in counts them) and
/// file bytes of a host directory (symlinks not followed).
fn tree_size(dir: &Path) -> std::io::Result<(u64, u64)> {
    let (mut entries, mut total) = (1u64, 0u64);
    let mut pending = vec![dir.to_owned()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.path().symlink_metadata()?;
            entries += 1;
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    Ok((entries, total))
}

fn describe(stat: &FileStat) -> String {
    format!(
        "a {} {}, mode {:04o}",
        bytes(stat.size),
        kind_name(stat.kind),
        stat.mode
    )
}

/// A copy checked and described, before it runs.
struct CopyPlan {
    /// What it does, without "would" or "did".
    action: String,
    host: PathBuf,
    guest: String,
    /// file or dir.
    kind: &'static str,
    /// What `transferred` counts: bytes or entries.
    unit: &'static str,
}

impl CopyPlan {
    /// The result of the copy, which `transferred` so many units, or of its
    /// preview (`None`).
    fn result(self, transferred: Option<u64>) -> CopyResult {
        let preview = transferred.is_none();
        CopyResult {
            preview,
            action: would_or_did(preview, &self.action),
            host_path: self.host,
            guest_path: self.guest,
            kind: self.kind.into(),
            transferred: transferred.unwrap_or(0),
            unit: self.unit.into(),
        }
    }
}

impl MicroagentServer {
    /// What is at a guest path, if anything.
    async fn stat_opt(&self, name: &str, path: &str) -> Result<Option<FileStat>, ToolError> {
        match self.ws.stat(name, path).await {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.code() == ErrorCode::NotFound => {
                // NOT_FOUND is also what a missing workspace gives.
                self.meta(name).await?;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[tool_router(router = files_router, vis = "pub(crate)")]
impl MicroagentServer {
    /// Read a guest file, or a part of it (offset, length; default the
    /// first 64 KiB). Text comes back as UTF-8, anything else as base64;
    /// next_offset says where the rest starts.
    #[tool(
        output_schema = crate::output::schema::<FileReadResult>(),
        annotations(
        title = "Read a file in a workspace",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn file_read(
        &self,
        Parameters(p): Parameters<FileReadParams>,
    ) -> ToolResult<FileReadResult> {
        guest_path("path", &p.path)?;
        let length = in_range(
            "length",
            p.length.unwrap_or(DEFAULT_READ_LENGTH),
            1,
            MAX_READ_LENGTH,
        )?;
        let offset = p.offset.unwrap_or(0);
        let workspace::FileRead { data, size, .. } = self
            .ws
            .read_file(&p.name, &p.path, Some(offset), Some(length))
            .await?;
        let reaches_end = offset.saturating_add(data.len() as u64) >= size;
        let (encoding, content, data) = encode(data, p.encoding, reaches_end);
        let end = offset.saturating_add(data.len() as u64);
        let eof = end >= size;
        Ok(Out(FileReadResult {
            path: p.path,
            size,
            offset,
            length: data.len() as u64,
            encoding,
            content,
            eof,
            next_offset: (!eof).then_some(end),
        }))
    }

    /// Write a guest file: replace it atomically (default) or append.
    /// Content is UTF-8 text or base64. preview: true reports what would
    /// be replaced without writing.
    #[tool(
        output_schema = crate::output::schema::<FileWriteResult>(),
        annotations(
        title = "Write a file in a workspace",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = false,
        open_world_hint = false
    )
    )]
    async fn file_write(
        &self,
        Parameters(p): Parameters<FileWriteParams>,
    ) -> ToolResult<FileWriteResult> {
        guest_path("path", &p.path)?;
        let data = match p.encoding.unwrap_or(Encoding::Utf8) {
            Encoding::Utf8 => p.content.into_bytes(),
            Encoding::Base64 => B64.decode(p.content.trim()).map_err(|e| {
                ToolError::InvalidInput(format!("content is not valid base64: {e}"))
            })?,
        };
        if data.len() > MAX_WRITE_BYTES {
            return Err(ToolError::InvalidInput(format!(
                "content is {}; file_write takes at most {} (use copy_in for large files)",
                bytes(data.len() as u64),
                bytes(MAX_WRITE_BYTES as u64)
            )));
        }
        let perm = p.mode.as_deref().map(parse_mode).transpose()?;
        let existing = self.stat_opt(&p.name, &p.path).await?;
        if let Some(s) = existing.as_ref().filter(|s| s.kind == FileKind::Dir) {
            return Err(ToolError::InvalidInput(format!(
                "{} is {}; name a file",
                p.path,
                describe(s)
            )));
        }
        let n = bytes(data.len() as u64);
        let action = match (&existing, p.append) {
            (Some(s), true) => format!("append {n} to {}, {}", p.path, describe(s)),
            (Some(s), false) => format!("replace {}, {}, with {n}", p.path, describe(s)),
            (None, _) => format!(
                "create {} with {n} (mode {:04o})",
                p.path,
                perm.unwrap_or(0o644)
            ),
        };
        let bytes = if p.preview {
            data.len() as u64
        } else {
            self.ws
                .write_file(
                    &p.name,
                    &p.path,
                    &data,
                    workspace::WriteOptions {
                        append: p.append,
                        perm,
                    },
                )
                .await?
        };
        Ok(Out(FileWriteResult {
            preview: p.preview,
            action: would_or_did(p.preview, &action),
            path: p.path,
            bytes,
            existing: existing.map(Into::into),
        }))
    }

    /// List a guest directory: names, kinds and sizes.
    #[tool(
        output_schema = crate::output::schema::<FileListResult>(),
        annotations(
        title = "List a directory in a workspace",
        read_only_hint = true,
        destructive_hint = false,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn file_list(
        &self,
        Parameters(p): Parameters<FileListParams>,
    ) -> ToolResult<FileListResult> {
        guest_path("path", &p.path)?;
        let workspace::DirListing {
            mut entries,
            truncated,
            ..
        } = self.ws.list_dir(&p.name, &p.path).await?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Out(FileListResult {
            path: p.path,
            entries: entries
                .into_iter()
                .map(|e| DirEntryView {
                    name: e.name,
                    kind: kind_name(e.kind).into(),
                    size: e.size,
                })
                .collect(),
            truncated,
        }))
    }

    /// Copy a host file or directory into a running workspace. A file
    /// replaces the guest file; a directory becomes (or merges into) the
    /// guest directory. preview: true reports what would be copied and
    /// replaced.
    #[tool(
        output_schema = crate::output::schema::<CopyResult>(),
        annotations(
        title = "Copy from the host into a workspace",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn copy_in(&self, Parameters(p): Parameters<CopyInParams>) -> ToolResult<CopyResult> {
        let host = self.host_roots.existing(&p.host_path)?;
        guest_path("guest_path", &p.guest_path)?;
        let meta = std::fs::metadata(&host).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                ToolError::InvalidInput(format!("{} does not exist on the host", host.display()))
            }
            _ => ToolError::InvalidInput(format!("cannot read {}: {e}", host.display())),
        })?;
        let target = self.stat_opt(&p.name, &p.guest_path).await?;
        let (kind, unit) = if meta.is_dir() {
            ("dir", "entries")
        } else {
            ("file", "bytes")
        };
        let source = if meta.is_dir() {
            let (entries, total) = tree_size(&host).map_err(|e| {
                ToolError::InvalidInput(format!("cannot read {}: {e}", host.display()))
            })?;
            format!(
                "host directory {} ({entries} entries, {} of files)",
                host.display(),
                bytes(total)
            )
        } else {
            format!("host file {} ({})", host.display(), bytes(meta.len()))
        };
        let effect = match (&target, meta.is_dir()) {
            (None, _) => "creating it".to_owned(),
            (Some(s), true) if s.kind == FileKind::Dir => {
                "merging into the existing directory".into()
            }
            (Some(s), false) if s.kind == FileKind::File => format!("replacing {}", describe(s)),
            (Some(s), _) => {
                return Err(ToolError::InvalidInput(format!(
                    "guest path {} is {}; a {kind} cannot be copied over it",
                    p.guest_path,
                    describe(s)
                )))
            }
        };
        let plan = CopyPlan {
            action: format!("copy {source} to {}:{}, {effect}", p.name, p.guest_path),
            host,
            guest: p.guest_path,
            kind,
            unit,
        };
        let transferred = if p.preview {
            None
        } else {
            Some(self.ws.copy_in(&p.name, &plan.host, &plan.guest).await?)
        };
        Ok(Out(plan.result(transferred)))
    }

    /// Copy a guest file or directory out of a running workspace to the
    /// host. An existing host path is refused unless overwrite: true.
    /// preview: true reports what would be copied and replaced.
    #[tool(
        output_schema = crate::output::schema::<CopyResult>(),
        annotations(
        title = "Copy from a workspace to the host",
        read_only_hint = false,
        destructive_hint = true,
        idempotent_hint = true,
        open_world_hint = false
    )
    )]
    async fn copy_out(&self, Parameters(p): Parameters<CopyOutParams>) -> ToolResult<CopyResult> {
        let host = self.host_roots.writable(&p.host_path)?;
        guest_path("guest_path", &p.guest_path)?;
        let stat = self.ws.stat(&p.name, &p.guest_path).await?;
        let kind = match stat.kind {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            other => {
                return Err(ToolError::InvalidInput(format!(
                    "{} is a {}; only files and directories can be copied",
                    p.guest_path,
                    kind_name(other)
                )))
            }
        };
        match host.parent() {
            Some(parent) if !parent.as_os_str().is_empty() && !parent.is_dir() => {
                return Err(ToolError::InvalidInput(format!(
                    "host directory {} does not exist",
                    parent.display()
                )))
            }
            _ => {}
        }
        let existing = std::fs::symlink_metadata(&host).ok();
        let effect = match &existing {
            None => "creating it".to_owned(),
            Some(_) if !p.overwrite => {
                return Err(ToolError::Conflict(format!(
                    "host path {} exists; pass overwrite: true to replace it (a directory is merged into)",
                    host.display()
                )))
            }
            Some(m) if m.is_dir() && kind == "dir" => "merging into the existing directory".into(),
            Some(m) if m.is_file() && kind == "file" => {
                format!("replacing a host file of {}", bytes(m.len()))
            }
            Some(_) => {
                return Err(ToolError::InvalidInput(format!(
                    "host path {} exists and is not a {kind}; name another path",
                    host.display()
                )))
            }
        };
        let plan = CopyPlan {
            action: format!(
                "copy guest {kind} {}:{} ({}) to host {}, {effect}",
                p.name,
                p.guest_path,
                bytes(stat.size),
                host.display()
            ),
            host,
            guest: p.guest_path,
            kind,
            unit: "bytes",
        };
        let transferred = if p.preview {
            None
        } else {
            Some(self.ws.copy_out(&p.name, &plan.guest, &plan.host).await?)
        };
        Ok(Out(plan.result(transferred)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_permission_bits() {
        assert_eq!(parse_mode("0755").unwrap(), 0o755);
        assert_eq!(parse_mode("644").unwrap(), 0o644);
        assert_eq!(parse_mode("0o600").unwrap(), 0o600);
        for bad in ["", "9", "rwx", "77777", "0o"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_are_text_when_they_can_be() {
        let (enc, text, _) = encode(b"hi\n".to_vec(), None, true);
        assert_eq!((enc, text.as_str()), (Encoding::Utf8, "hi\n"));
        let (enc, _, _) = encode(vec![0xff, 0xfe], None, true);
        assert_eq!(enc, Encoding::Base64);
        // "é" is 0xc3 0xa9: a part ending between them is cut back.
        let (enc, text, kept) = encode(vec![b'a', 0xc3], None, false);
        assert_eq!((enc, text.as_str(), kept.len()), (Encoding::Utf8, "a", 1));
        let (enc, text, _) = encode(b"ok".to_vec(), Some(Encoding::Base64), true);
        assert_eq!((enc, text.as_str()), (Encoding::Base64, "b2s="));
    }
}
