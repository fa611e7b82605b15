//! File tools: read, write and list guest files; copy files and directories
//! between host and guest. Writes and copies accept preview: true.

use base64::Engine;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::{tool, tool_router};
use workspace::guest::copy::{describe_stat, human_bytes, kind_name, CopyOptions, CopyPlan};
use workspace::guest::{Copied, FileKind};

use super::{guest_path, in_range, would_or_did};
use crate::output::{Out, ToolResult};
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

/// The result of `plan`, which `transferred` so many units, or of its
/// preview (`None`).
fn copy_result(plan: CopyPlan, copied: Option<Copied>) -> CopyResult {
    let preview = copied.is_none();
    let copied = copied.unwrap_or_default();
    CopyResult {
        preview,
        action: would_or_did(preview, &plan.action),
        unit: plan.unit().into(),
        kind: plan.kind.as_str().into(),
        host_path: plan.host_path,
        guest_path: plan.guest_path,
        transferred: copied.count,
        left_out: copied.left_out,
        left_out_entries: copied.left_out_entries,
    }
}

impl MicroagentServer {
    /// `file_read` by lines.
    async fn file_read_lines(&self, p: FileReadParams) -> ToolResult<FileReadResult> {
        if p.offset.is_some() || p.length.is_some() || p.encoding == Some(Encoding::Base64) {
            return Err(ToolError::InvalidInput(
                "read by lines (start_line, end_line) or by bytes (offset, length), not both; lines are UTF-8 text".into(),
            ));
        }
        let lines = self
            .ws
            .workspace(&p.name)?
            .files()
            .read_lines(&p.path, p.start_line.unwrap_or(1), p.end_line)
            .await?;
        let length = lines.text.len() as u64;
        let part = lines.start_line > 1 || lines.end_line < lines.total_lines;
        let whole = part.then(|| crate::uris::file_uri(&p.name, &p.path));
        Ok(Out(FileReadResult {
            path: p.path,
            size: lines.size,
            offset: 0,
            length,
            encoding: Encoding::Utf8,
            content: lines.text,
            eof: lines.end_line == lines.total_lines,
            next_offset: None,
            lines: Some(LineRange {
                start_line: lines.start_line,
                end_line: lines.end_line,
                total_lines: lines.total_lines,
            }),
            whole,
        }))
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
        if p.start_line.is_some() || p.end_line.is_some() {
            return self.file_read_lines(p).await;
        }
        let length = in_range(
            "length",
            p.length.unwrap_or(DEFAULT_READ_LENGTH),
            1,
            MAX_READ_LENGTH,
        )?;
        let offset = p.offset.unwrap_or(0);
        let workspace::FileRead { data, size, .. } = self
            .ws
            .workspace(&p.name)?
            .files()
            .read_file(&p.path, Some(offset), Some(length))
            .await?;
        let reaches_end = offset.saturating_add(data.len() as u64) >= size;
        let (encoding, content, data) = encode(data, p.encoding, reaches_end);
        let end = offset.saturating_add(data.len() as u64);
        let eof = end >= size;
        let whole = (offset > 0 || !eof).then(|| crate::uris::file_uri(&p.name, &p.path));
        Ok(Out(FileReadResult {
            path: p.path,
            size,
            offset,
            length: data.len() as u64,
            encoding,
            content,
            eof,
            next_offset: (!eof).then_some(end),
            lines: None,
            whole,
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
                human_bytes(data.len() as u64),
                human_bytes(MAX_WRITE_BYTES as u64)
            )));
        }
        let perm = p.mode.as_deref().map(parse_mode).transpose()?;
        let existing = self
            .ws
            .workspace(&p.name)?
            .files()
            .stat_if_exists(&p.path)
            .await?;
        if let Some(s) = existing.as_ref().filter(|s| s.kind == FileKind::Dir) {
            return Err(ToolError::InvalidInput(format!(
                "{} is {}; name a file",
                p.path,
                describe_stat(s)
            )));
        }
        let n = human_bytes(data.len() as u64);
        let action = match (&existing, p.append) {
            (Some(s), true) => format!("append {n} to {}, {}", p.path, describe_stat(s)),
            (Some(s), false) => format!("replace {}, {}, with {n}", p.path, describe_stat(s)),
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
                .workspace(&p.name)?
                .files()
                .write_file(
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
        let workspace::guest::DirListing {
            mut entries,
            truncated,
            ..
        } = self
            .ws
            .workspace(&p.name)?
            .files()
            .list_dir(&p.path)
            .await?;
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
        let plan = self
            .ws
            .workspace(&p.name)?
            .files()
            .plan_copy_in(&host, &p.guest_path)
            .await?;
        let copied = if p.preview {
            None
        } else {
            Some(plan.carry_out(&self.ws).await?)
        };
        Ok(Out(copy_result(plan, copied)))
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
        let options = CopyOptions::default()
            .overwrite(p.overwrite)
            .include_git_metadata(p.include_git_metadata);
        let plan = self
            .ws
            .workspace(&p.name)?
            .files()
            .plan_copy_out(&p.guest_path, &host, options)
            .await?;
        let copied = if p.preview {
            None
        } else {
            Some(plan.carry_out(&self.ws).await?)
        };
        Ok(Out(copy_result(plan, copied)))
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
