//! An error and its causes as one line of text, for logs and messages.

/// An error and its causes on one line, each cause once (a message that
/// already quotes its cause is not repeated).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}
