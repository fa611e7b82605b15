//! Jupyter's message wire format (jupyter-client's "Messaging in
//! Jupyter", protocol 5.3) on ZMTP frames: identities, `<IDS|MSG>`, the
//! HMAC-SHA256 of the four JSON parts, then header, parent header,
//! metadata and content. A message whose signature is not the session
//! key's is refused: the key is the host's, made per session.

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

const DELIMITER: &[u8] = b"<IDS|MSG>";
/// The protocol version our headers say.
const PROTOCOL_VERSION: &str = "5.3";

/// Why a frame list is not a message of this session.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// No `<IDS|MSG>` or too few parts after it.
    #[error("not a Jupyter message: {0}")]
    Shape(&'static str),
    /// The signature is not the session key's.
    #[error("a message with a wrong signature")]
    Signature,
    /// A JSON part does not parse, or the header lacks its fields.
    #[error("a Jupyter message whose {part} is not valid")]
    Json {
        /// Which part.
        part: &'static str,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
}

/// A message as this client reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// `header.msg_type`.
    pub msg_type: String,
    /// `header.msg_id`.
    pub msg_id: String,
    /// `parent_header.msg_id`, when there is one.
    pub parent_id: Option<String>,
    /// The content.
    pub content: Value,
}

/// Signs and checks messages with a session's key.
pub struct Signer {
    key: Vec<u8>,
    session: String,
}

impl Signer {
    /// A signer for `key` (the connection file's `key`), whose headers name
    /// `session`.
    pub fn new(key: &[u8], session: String) -> Self {
        Self {
            key: key.to_vec(),
            session,
        }
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        Hmac::<Sha256>::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!())
    }

    /// The frames of a `msg_type` request with `content`, its id `msg_id`.
    pub fn request(&self, msg_type: &str, msg_id: &str, content: &Value) -> Vec<Vec<u8>> {
        let header = json!({
            "msg_id": msg_id,
            "session": self.session,
            "username": "microagent",
            "date": "1970-01-01T00:00:00.000000Z",
            "msg_type": msg_type,
            "version": PROTOCOL_VERSION,
        });
        let parts = [header, json!({}), json!({}), content.clone()].map(|v| v.to_string());
        let mut mac = self.mac();
        for part in &parts {
            mac.update(part.as_bytes());
        }
        let signature = hex(&mac.finalize().into_bytes());
        let mut frames = vec![DELIMITER.to_vec(), signature.into_bytes()];
        frames.extend(parts.map(String::into_bytes));
        frames
    }

    /// A kernel's message for tests: `msg_type` with `content`, answering
    /// `parent`.
    #[cfg(test)]
    pub(crate) fn reply_for_tests(
        &self,
        msg_type: &str,
        parent: &str,
        content: &Value,
    ) -> Vec<Vec<u8>> {
        let header = json!({"msg_id": format!("k-{parent}"), "session": "kernel", "msg_type": msg_type, "version": PROTOCOL_VERSION});
        let parts = [
            header,
            json!({"msg_id": parent}),
            json!({}),
            content.clone(),
        ]
        .map(|v| v.to_string());
        let mut mac = self.mac();
        for part in &parts {
            mac.update(part.as_bytes());
        }
        let mut frames = vec![
            DELIMITER.to_vec(),
            hex(&mac.finalize().into_bytes()).into_bytes(),
        ];
        frames.extend(parts.map(String::into_bytes));
        frames
    }

    /// The message in `frames`, its signature checked first; `None` when
    /// `wanted` refuses its parent's id (its content is then not parsed:
    /// messages for other requests cost no more than their header).
    pub fn read(
        &self,
        frames: &[Vec<u8>],
        wanted: impl Fn(Option<&str>) -> bool,
    ) -> Result<Option<Message>, WireError> {
        let at = frames
            .iter()
            .position(|f| f == DELIMITER)
            .ok_or(WireError::Shape("no <IDS|MSG>"))?;
        let rest = &frames[at + 1..];
        let [signature, header, parent, metadata, content, ..] = rest else {
            return Err(WireError::Shape("fewer than five parts"));
        };
        let mut mac = self.mac();
        for part in [header, parent, metadata, content] {
            mac.update(part);
        }
        let given = unhex(signature).ok_or(WireError::Signature)?;
        mac.verify_slice(&given).map_err(|_| WireError::Signature)?;
        let json = |part: &'static str, bytes: &[u8]| {
            serde_json::from_slice::<Value>(bytes)
                .map_err(|source| WireError::Json { part, source })
        };
        let header = json("header", header)?;
        let parent = json("parent header", parent)?;
        let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
        let bad_header = |what: &str| WireError::Json {
            part: "header",
            source: serde::de::Error::custom(format!("no {what}")),
        };
        let parent_id = text(&parent, "msg_id");
        if !wanted(parent_id.as_deref()) {
            return Ok(None);
        }
        Ok(Some(Message {
            msg_type: text(&header, "msg_type").ok_or_else(|| bad_header("msg_type"))?,
            msg_id: text(&header, "msg_id").ok_or_else(|| bad_header("msg_id"))?,
            parent_id,
            content: json("content", content)?,
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks(2)
        .map(|pair| {
            let s = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(s, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply as a kernel sends it: an identity, then the request's parts.
    fn reply(signer: &Signer, msg_type: &str, parent: &str) -> Vec<Vec<u8>> {
        let mut frames = signer.request(msg_type, "reply-1", &json!({"status": "ok"}));
        frames[3] = json!({"msg_id": parent}).to_string().into_bytes();
        let mut mac = signer.mac();
        for part in &frames[2..6] {
            mac.update(part);
        }
        frames[1] = hex(&mac.finalize().into_bytes()).into_bytes();
        frames.insert(0, b"kernel.1.status".to_vec());
        frames
    }

    #[test]
    fn a_signed_message_reads_and_a_changed_one_does_not() {
        let signer = Signer::new(b"the key", "s".into());
        let frames = reply(&signer, "execute_reply", "req-1");
        let message = signer.read(&frames, |_| true).unwrap().unwrap();
        assert_eq!(message.msg_type, "execute_reply");
        assert_eq!(message.parent_id.as_deref(), Some("req-1"));
        assert_eq!(message.content["status"], "ok");
        let mut changed = frames.clone();
        changed[6] = br#"{"status":"error"}"#.to_vec();
        assert!(matches!(
            signer.read(&changed, |_| true),
            Err(WireError::Signature)
        ));
        let other = Signer::new(b"another key", "s".into());
        assert!(matches!(
            other.read(&frames, |_| true),
            Err(WireError::Signature)
        ));
        let mut garbage = frames.clone();
        garbage[2] = b"zz".to_vec();
        assert!(matches!(
            signer.read(&garbage, |_| true),
            Err(WireError::Signature)
        ));
    }

    #[test]
    fn content_of_other_parents_is_not_parsed() {
        let signer = Signer::new(b"k", "s".into());
        let mut frames = reply(&signer, "stream", "someone-else");
        // Signed, but its content is no JSON: passed over unread.
        frames[6] = b"[0,0,0,".to_vec();
        let mut mac = signer.mac();
        for part in &frames[3..7] {
            mac.update(part);
        }
        frames[2] = hex(&mac.finalize().into_bytes()).into_bytes();
        let ours = |p: Option<&str>| p == Some("ours");
        assert_eq!(signer.read(&frames, ours).unwrap(), None);
        assert!(signer.read(&frames, |_| true).is_err());
    }

    #[test]
    fn cut_and_malformed_frames_are_errors() {
        let signer = Signer::new(b"k", "s".into());
        let frames = reply(&signer, "status", "p");
        for cut in 0..frames.len() - 1 {
            assert!(signer.read(&frames[..cut], |_| true).is_err(), "{cut}");
        }
        assert!(signer.read(&[b"no delimiter".to_vec()], |_| true).is_err());
        // Signed but not JSON: refused as JSON, after the signature.
        let mut bad = signer.request("x", "id", &json!({}));
        bad[5] = b"{not json".to_vec();
        let mut mac = signer.mac();
        for part in &bad[2..6] {
            mac.update(part);
        }
        bad[1] = hex(&mac.finalize().into_bytes()).into_bytes();
        assert!(matches!(
            signer.read(&bad, |_| true),
            Err(WireError::Json { .. })
        ));
    }
}
