//! Replacing secrets' values by [`MASK`] in what a command prints: in a
//! whole text, in a stream of chunks ([`MaskStream`], which holds back a
//! tail that could be the start of a value until the next chunk tells),
//! and in one read of a process's output from a cursor
//! ([`SecretMask::mask_read`]). Bytes covered by any occurrence of any
//! value (occurrences may overlap) become one `***` per contiguous run.

use super::SecretValue;

/// What each secret value is replaced by.
pub const MASK: &str = "***";

/// The values to mask.
#[derive(Clone, Default)]
pub struct SecretMask {
    values: Vec<Vec<u8>>,
    max_len: usize,
}

impl std::fmt::Debug for SecretMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretMask({} values)", self.values.len())
    }
}

impl SecretMask {
    /// A mask of `values`.
    pub fn new<'a, I>(values: I) -> Self
    where
        I: IntoIterator<Item = &'a SecretValue>,
    {
        let mut values: Vec<Vec<u8>> = values
            .into_iter()
            .map(|v| v.expose().as_bytes().to_vec())
            .filter(|v| !v.is_empty())
            .collect();
        values.sort();
        values.dedup();
        let max_len = values.iter().map(Vec::len).max().unwrap_or(0);
        Self { values, max_len }
    }

    /// True when it masks nothing.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `bytes` with every value masked.
    pub fn mask(&self, bytes: &[u8]) -> Vec<u8> {
        let mut stream = self.stream();
        let mut out = stream.push(bytes);
        out.extend(stream.finish());
        out
    }

    /// `text` with every value masked.
    pub fn mask_str(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_owned();
        }
        // Values are UTF-8 and so is the mask: a match never splits a
        // character, so the result is UTF-8 too.
        String::from_utf8_lossy(&self.mask(text.as_bytes())).into_owned()
    }

    /// A stream masker for one output stream.
    pub fn stream(&self) -> MaskStream {
        MaskStream {
            mask: self.clone(),
            pending: Vec::new(),
            covered: 0,
            in_run: false,
        }
    }

    /// One read of a stream from a cursor, without state between reads:
    /// the masked bytes and how many of `bytes` they stand for (the next
    /// read starts there). Unless `last` (no more output will come), a
    /// tail that could be the start of a value is left for the next read,
    /// and so is a masked run that reaches into it.
    pub fn mask_read(&self, bytes: &[u8], last: bool) -> (Vec<u8>, usize) {
        if self.is_empty() {
            return (bytes.to_vec(), bytes.len());
        }
        let cover = self.coverage(bytes, 0);
        let mut upto = if last {
            bytes.len()
        } else {
            self.held_from(bytes)
        };
        if upto > 0 && upto < bytes.len() && cover[upto] && cover[upto - 1] {
            let start = cover[..upto].iter().rposition(|c| !c).map_or(0, |i| i + 1);
            // A run from the very start is given whole (as one mask) so
            // that reads make progress.
            upto = if start > 0 {
                start
            } else {
                upto + cover[upto..].iter().take_while(|c| **c).count()
            };
        }
        let mut in_run = false;
        (render(bytes, &cover, upto, &mut in_run), upto)
    }

    /// Which bytes of `buf` an occurrence of a value covers (the first
    /// `covered` are covered already).
    fn coverage(&self, buf: &[u8], covered: usize) -> Vec<bool> {
        let mut cover = vec![false; buf.len()];
        cover[..covered.min(buf.len())].fill(true);
        for v in &self.values {
            if v.len() > buf.len() {
                continue;
            }
            for (i, w) in buf.windows(v.len()).enumerate() {
                if w == v.as_slice() {
                    cover[i..i + v.len()].fill(true);
                }
            }
        }
        cover
    }

    /// Where the earliest tail of `buf` that is a proper prefix of a value
    /// begins (`buf.len()` when none): bytes from there are not decided
    /// until more come.
    fn held_from(&self, buf: &[u8]) -> usize {
        let n = buf.len();
        let lo = n.saturating_sub(self.max_len.saturating_sub(1));
        (lo..n)
            .find(|&s| {
                self.values
                    .iter()
                    .any(|v| v.len() > n - s && v.starts_with(&buf[s..]))
            })
            .unwrap_or(n)
    }
}

/// The first `upto` bytes of `buf`, each covered run as one [`MASK`]
/// (none when `in_run` says the run began in an earlier call).
fn render(buf: &[u8], cover: &[bool], upto: usize, in_run: &mut bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(upto);
    for (byte, covered) in buf[..upto].iter().zip(cover) {
        if *covered {
            if !*in_run {
                out.extend_from_slice(MASK.as_bytes());
                *in_run = true;
            }
        } else {
            *in_run = false;
            out.push(*byte);
        }
    }
    out
}

/// Masks one output stream chunk by chunk: feed it [`MaskStream::push`],
/// then [`MaskStream::finish`] at the end. The concatenated output is what
/// [`SecretMask::mask`] gives for the whole stream, however it was cut.
#[derive(Debug)]
pub struct MaskStream {
    mask: SecretMask,
    /// Bytes not yet given out: a tail that may begin a value.
    pending: Vec<u8>,
    /// Leading bytes of `pending` an occurrence already found covers.
    covered: usize,
    /// The last byte given out was masked (a run goes on as one mask).
    in_run: bool,
}

impl MaskStream {
    /// The masked output `chunk` makes final.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.mask.is_empty() {
            return chunk.to_vec();
        }
        self.pending.extend_from_slice(chunk);
        let upto = self.mask.held_from(&self.pending);
        self.emit(upto)
    }

    /// The rest, at the end of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        let out = self.emit(self.pending.len());
        self.in_run = false;
        out
    }

    fn emit(&mut self, upto: usize) -> Vec<u8> {
        let cover = self.mask.coverage(&self.pending, self.covered);
        let out = render(&self.pending, &cover, upto, &mut self.in_run);
        // Every occurrence that starts before `upto` is complete: what it
        // covers past `upto` is remembered, the rest is found again.
        self.covered = cover[upto..].iter().take_while(|c| **c).count();
        self.pending.drain(..upto);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask(values: &[&str]) -> SecretMask {
        let values: Vec<SecretValue> = values
            .iter()
            .map(|v| SecretValue::new("S", v.as_bytes().to_vec()).unwrap())
            .collect();
        SecretMask::new(values.iter())
    }

    fn streamed(m: &SecretMask, chunks: &[&[u8]]) -> Vec<u8> {
        let mut s = m.stream();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(s.push(c));
        }
        out.extend(s.finish());
        out
    }

    /// Reads `text` as a process reader would: from cursors, `step` bytes
    /// available more each time.
    fn read_by_cursor(m: &SecretMask, text: &[u8], step: usize) -> Vec<u8> {
        let (mut cursor, mut avail, mut out) = (0, 0, Vec::new());
        loop {
            avail = (avail + step).min(text.len());
            let last = avail == text.len();
            let (bytes, used) = m.mask_read(&text[cursor..avail], last);
            out.extend(bytes);
            cursor += used;
            if last {
                assert_eq!(cursor, text.len());
                return out;
            }
        }
    }

    #[test]
    fn values_are_masked_in_whole_text() {
        let m = mask(&["hunter2", "tok"]);
        assert_eq!(m.mask_str("pw=hunter2 t=tok."), "pw=*** t=***.");
        assert_eq!(m.mask_str("nothing here"), "nothing here");
        assert_eq!(m.mask_str("hunter2"), "***", "a value that is all of it");
        assert_eq!(m.mask_str("x hunter2"), "x ***", "a value at the end");
        assert_eq!(m.mask_str("hunter2hunter2"), "***", "adjacent: one run");
        assert_eq!(mask(&[]).mask_str("hunter2"), "hunter2");
    }

    #[test]
    fn overlapping_values_are_masked_whole() {
        let m = mask(&["abc", "bcd"]);
        assert_eq!(m.mask_str("xabcdx"), "x***x");
        let m = mask(&["aa"]);
        assert_eq!(m.mask_str("aaa b aa"), "*** b ***");
        let m = mask(&["secret", "secretive"]);
        assert_eq!(m.mask_str("a secretive b secre"), "a *** b secre");
    }

    #[test]
    fn a_value_split_across_chunks_is_masked() {
        let m = mask(&["hunter2"]);
        assert_eq!(streamed(&m, &[b"pw=hun", b"ter2!"]), b"pw=***!");
        assert_eq!(streamed(&m, &[b"pw=h", b"u", b"n", b"ter2"]), b"pw=***");
        // A prefix that turns out not to be one is given out later.
        let mut s = m.stream();
        assert_eq!(s.push(b"ab hun"), b"ab ");
        assert_eq!(s.push(b"gry"), b"hungry");
        assert_eq!(s.push(b" hunt"), b" ");
        assert_eq!(s.finish(), b"hunt", "the end flushes what was held");
    }

    #[test]
    fn streaming_matches_the_whole_text_however_it_is_cut() {
        let m = mask(&["abcab", "bca", "zz", "cabx"]);
        let text = b"abcabcabxzzzabcaqqabcab-bcabcax-zz";
        let whole = m.mask(text);
        for step in 1..text.len() {
            let chunks: Vec<&[u8]> = text.chunks(step).collect();
            assert_eq!(streamed(&m, &chunks), whole, "chunks of {step}");
        }
        // Cut at every pair of places.
        for i in 0..text.len() {
            for j in i..text.len() {
                let chunks = [&text[..i], &text[i..j], &text[j..]];
                assert_eq!(streamed(&m, &chunks), whole, "cut at {i} and {j}");
            }
        }
    }

    #[test]
    fn cursor_reads_never_show_a_value() {
        let m = mask(&["hunter2", "aa", "xyzzy"]);
        let text = b"start hunter2 mid aaaa end xyzz xyzzy hunter2";
        for step in 1..=text.len() {
            let out = read_by_cursor(&m, text, step);
            let out = String::from_utf8(out).unwrap();
            assert!(!out.contains("hunter2"), "step {step}: {out}");
            assert!(!out.contains("xyzzy"), "step {step}: {out}");
            assert!(!out.contains("aa"), "step {step}: {out}");
            assert!(out.starts_with("start "), "step {step}: {out}");
            assert!(out.contains("xyzz "), "a near miss is shown: {out}");
        }
        // A run of masked bytes past the cut is left whole for later.
        let (out, used) = m.mask_read(b"ok hunter2 xy", false);
        assert_eq!((out.as_slice(), used), (&b"ok *** "[..], 11));
    }

    #[test]
    fn the_mask_shows_no_value_when_printed() {
        let m = mask(&["hunter2"]);
        assert!(!format!("{m:?}").contains("hunter2"));
        let v = SecretValue::new("S", b"hunter2".to_vec()).unwrap();
        assert_eq!(format!("{v:?}"), "***");
    }
}
