//! What a run keeps of what its kernel sends: streams, the result, rich
//! displays and the error, each within its bound (`CodeRunLimits`), with
//! terminal escapes taken out of what goes to a caller.

use serde_json::Value;

use super::wire::Message;
use super::{CodeException, CodeOutput, CodeRun};

/// The image types a display carries in base64.
const BASE64_IMAGES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];
/// Bytes of a result's text kept.
const MAX_RESULT_BYTES: usize = 1024 * 1024;
/// Bytes of an exception's name, and of its value, kept.
const MAX_NAME_BYTES: usize = 64 * 1024;
/// Bytes of a traceback kept, all lines together.
const MAX_TRACEBACK_BYTES: usize = 256 * 1024;

/// Bounds on what one run keeps.
#[derive(Debug, Clone, Copy)]
pub struct CodeRunLimits {
    /// Bytes of stdout, and of stderr, kept (the first ones).
    pub stream_bytes: usize,
    /// Bytes of rich outputs kept, all together.
    pub output_bytes: usize,
    /// Rich outputs kept.
    pub outputs: usize,
}

impl Default for CodeRunLimits {
    fn default() -> Self {
        Self {
            stream_bytes: 1024 * 1024,
            output_bytes: 16 * 1024 * 1024,
            outputs: 32,
        }
    }
}

/// What a run has produced so far, within its limits.
pub(crate) struct Gathered {
    limits: CodeRunLimits,
    run: CodeRun,
    output_bytes: usize,
}

impl Gathered {
    pub(crate) fn new(limits: CodeRunLimits) -> Self {
        Self {
            limits,
            run: CodeRun::default(),
            output_bytes: 0,
        }
    }

    pub(crate) fn take(&mut self, message: &Message, on_stream: &mut impl FnMut(&str, &str)) {
        let c = &message.content;
        match message.msg_type.as_str() {
            "stream" => {
                let text = c["text"].as_str().unwrap_or_default();
                let name = if c["name"] == "stderr" {
                    "stderr"
                } else {
                    "stdout"
                };
                on_stream(name, text);
                let kept = if name == "stderr" {
                    &mut self.run.stderr
                } else {
                    &mut self.run.stdout
                };
                if !push_bounded(kept, text, self.limits.stream_bytes) {
                    self.run.truncated = true;
                }
            }
            "execute_result" => {
                self.run.result = c["data"]["text/plain"].as_str().map(|text| {
                    let mut kept = String::new();
                    if !push_bounded(&mut kept, text, MAX_RESULT_BYTES) {
                        self.run.truncated = true;
                    }
                    kept
                });
                self.outputs(&c["data"], true);
            }
            "display_data" => self.outputs(&c["data"], false),
            "error" => {
                // The traceback's lines share one bound; a name and value
                // have their own.
                let mut left = MAX_TRACEBACK_BYTES;
                let mut cut = false;
                let mut text = |v: &Value, bound: usize| {
                    let mut kept = String::new();
                    let whole = strip_ansi(v.as_str().unwrap_or_default());
                    cut |= !push_bounded(&mut kept, &whole, bound);
                    kept
                };
                let name = text(&c["ename"], MAX_NAME_BYTES);
                let value = text(&c["evalue"], MAX_NAME_BYTES);
                let mut traceback = Vec::new();
                for line in c["traceback"].as_array().into_iter().flatten().take(200) {
                    let kept = text(line, left);
                    left -= kept.len();
                    traceback.push(kept);
                    if left == 0 {
                        break;
                    }
                }
                self.run.truncated |= cut;
                self.run.error = Some(CodeException {
                    name,
                    value,
                    traceback,
                });
            }
            "clear_output" => {
                self.run.stdout.clear();
                self.run.stderr.clear();
                self.run.outputs.clear();
                self.output_bytes = 0;
            }
            _ => {}
        }
    }

    /// Each representation of a display but plain text, which is kept
    /// only when it is all there is (the result's is `result`).
    fn outputs(&mut self, data: &Value, is_result: bool) {
        let Some(bundle) = data.as_object() else {
            return;
        };
        let rich = bundle.keys().any(|m| m != "text/plain");
        for (mime, value) in bundle {
            if mime == "text/plain" && (rich || is_result) {
                continue;
            }
            let data = match value {
                // Base64 as IPython writes it ends in a newline (and may be
                // wrapped): the data alone, for clients that decode it.
                Value::String(s) if BASE64_IMAGES.contains(&mime.as_str()) => {
                    s.chars().filter(|c| !c.is_ascii_whitespace()).collect()
                }
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if self.run.outputs.len() >= self.limits.outputs
                || self.output_bytes + data.len() > self.limits.output_bytes
            {
                self.run.truncated = true;
                continue;
            }
            self.output_bytes += data.len();
            self.run.outputs.push(CodeOutput {
                mime: mime.chars().take(128).collect(),
                data,
            });
        }
    }

    pub(crate) fn reply(&mut self, content: &Value) {
        self.run.execution_count = content["execution_count"].as_u64();
        if content["status"] == "aborted" {
            self.run.stopped = Some("aborted by the kernel".into());
        }
    }

    pub(crate) fn finish(self) -> CodeRun {
        self.run
    }
}

/// Appends what fits of `text` within `limit` bytes (on a character
/// boundary); whether all of it did.
fn push_bounded(kept: &mut String, text: &str, limit: usize) -> bool {
    let room = limit.saturating_sub(kept.len());
    if text.len() <= room {
        kept.push_str(text);
        return true;
    }
    let mut end = room;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    kept.push_str(&text[..end]);
    false
}

/// `text` without ANSI escape sequences (tracebacks come colored).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // Parameters and intermediates, then one final byte.
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(msg_type: &str, content: Value) -> Message {
        Message {
            msg_type: msg_type.into(),
            msg_id: "m".into(),
            parent_id: Some("p".into()),
            content,
        }
    }

    #[test]
    fn outputs_are_gathered_within_their_limits() {
        let limits = CodeRunLimits {
            stream_bytes: 8,
            output_bytes: 10,
            outputs: 2,
        };
        let mut g = Gathered::new(limits);
        let mut heard = Vec::new();
        let mut hear = |n: &str, t: &str| heard.push(format!("{n}:{t}"));
        g.take(
            &message("stream", json!({"name": "stdout", "text": "héllo wörld"})),
            &mut hear,
        );
        g.take(
            &message("stream", json!({"name": "stderr", "text": "warn"})),
            &mut hear,
        );
        g.take(
            &message(
                "execute_result",
                json!({"data": {"text/plain": "42", "text/html": "<b>42</b>"}}),
            ),
            &mut hear,
        );
        g.take(
            &message(
                "display_data",
                json!({"data": {"image/png": "iVBORw0KGgo="}}),
            ),
            &mut hear,
        );
        g.take(
            &message("error", json!({"ename": "\u{1b}[31mValueError\u{1b}[0m", "evalue": "bad", "traceback": ["\u{1b}[1;31mline\u{1b}[0m"]})),
            &mut hear,
        );
        let run = g.finish();
        assert_eq!(heard, ["stdout:héllo wörld", "stderr:warn"]);
        assert_eq!(run.stdout, "héllo w", "cut on a character boundary");
        assert_eq!(run.stderr, "warn");
        assert_eq!(run.result.as_deref(), Some("42"));
        assert_eq!(run.outputs.len(), 1, "{:?}", run.outputs);
        assert_eq!(run.outputs[0].mime, "text/html");
        assert!(run.truncated);
        let error = run.error.unwrap();
        assert_eq!(
            (error.name.as_str(), error.traceback[0].as_str()),
            ("ValueError", "line")
        );
    }

    #[test]
    fn plain_text_displays_are_kept_only_alone_and_garbage_is_passed_over() {
        let mut g = Gathered::new(CodeRunLimits::default());
        let mut hear = |_: &str, _: &str| {};
        g.take(
            &message("display_data", json!({"data": {"text/plain": "alone"}})),
            &mut hear,
        );
        g.take(
            &message("display_data", json!({"data": "not a bundle"})),
            &mut hear,
        );
        g.take(&message("stream", json!({"text": 7})), &mut hear);
        g.take(
            &message("error", json!({"traceback": "not a list"})),
            &mut hear,
        );
        g.take(&message("no_such_type", json!(null)), &mut hear);
        // IPython's base64 ends in a newline: the image is its data alone.
        g.take(
            &message(
                "display_data",
                json!({"data": {"image/png": "iVBORw0K\nGgo=\n", "text/plain": "<Figure>"}}),
            ),
            &mut hear,
        );
        let run = g.finish();
        assert_eq!(run.outputs.len(), 2);
        assert_eq!(run.outputs[0].data, "alone");
        assert_eq!(run.outputs[1].data, "iVBORw0KGgo=");
        assert_eq!(run.error.unwrap().traceback.len(), 0);
    }

    #[test]
    fn a_huge_result_or_traceback_is_cut_and_marked() {
        let mut g = Gathered::new(CodeRunLimits::default());
        let mut hear = |_: &str, _: &str| {};
        let huge = "r".repeat(MAX_RESULT_BYTES + 10);
        g.take(
            &message("execute_result", json!({"data": {"text/plain": huge}})),
            &mut hear,
        );
        let line = "t".repeat(100 * 1024);
        g.take(
            &message(
                "error",
                json!({"ename": "n".repeat(MAX_NAME_BYTES * 2), "evalue": "v",
                "traceback": [line, line, line, line]}),
            ),
            &mut hear,
        );
        let run = g.finish();
        assert_eq!(run.result.unwrap().len(), MAX_RESULT_BYTES);
        let error = run.error.unwrap();
        assert_eq!(error.name.len(), MAX_NAME_BYTES);
        let kept: usize = error.traceback.iter().map(String::len).sum();
        assert_eq!(kept, MAX_TRACEBACK_BYTES);
        assert!(run.truncated);
    }

    #[test]
    fn ansi_sequences_are_stripped() {
        assert_eq!(strip_ansi("\u{1b}[0;31mA\u{1b}[0m b\u{1b}"), "A b");
        assert_eq!(strip_ansi("\u{1b}[38;5;12mx"), "x");
    }
}
