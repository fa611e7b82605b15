//! The bearer token of `serve mcp --http`: made once into the state
//! directory (`mcp-token`, 0600) and read back by every later start, or
//! read from a file the operator names.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Random bytes in a made token (64 hex digits).
const TOKEN_BYTES: usize = 32;

/// Why the token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Reading or writing the token file failed.
    #[error("{what} {}", path.display())]
    File {
        /// Which step.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no token.
    #[error("{} holds no token (one line of printable characters)", .0.display())]
    Empty(PathBuf),
}

fn file_error(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> TokenError {
    let path = path.to_owned();
    move |source| TokenError::File { what, path, source }
}

/// The token in `path`: its first line, trimmed.
pub fn read(path: &Path) -> Result<String, TokenError> {
    let text = std::fs::read_to_string(path).map_err(file_error("reading", path))?;
    let token = text.lines().next().unwrap_or_default().trim();
    if token.is_empty() || token.chars().any(|c| c.is_control()) {
        return Err(TokenError::Empty(path.to_owned()));
    }
    Ok(token.to_owned())
}

/// The token in `path`, made (random, 0600) when the file does not exist;
/// true when it was made now.
pub fn read_or_make(path: &Path) -> Result<(String, bool), TokenError> {
    let mut bytes = [0u8; TOKEN_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(file_error("reading", Path::new("/dev/urandom")))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match made {
        Ok(mut file) => {
            let written = file
                .write_all(format!("{token}\n").as_bytes())
                .and_then(|()| file.sync_all());
            if let Err(e) = written {
                let _ = std::fs::remove_file(path);
                return Err(file_error("writing", path)(e));
            }
            Ok((token, true))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok((read(path)?, false)),
        Err(e) => Err(file_error("creating", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh private directory for one test.
    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mcp-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_token_is_made_once_then_read() {
        let dir = scratch("token-made");
        let path = dir.join("mcp-token");
        let (made, fresh) = read_or_make(&path).unwrap();
        assert!(fresh);
        assert_eq!(made.len(), 2 * TOKEN_BYTES);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read_or_make(&path).unwrap(), (made.clone(), false));
        assert_eq!(read(&path).unwrap(), made);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_empty_token_file_is_refused() {
        let dir = scratch("token-empty");
        let path = dir.join("t");
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(read(&path), Err(TokenError::Empty(_))));
        assert!(matches!(
            read(&dir.join("missing")),
            Err(TokenError::File { .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
