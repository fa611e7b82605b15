//! TLS for a public `serve mcp --http`: a certificate chain and its key
//! from PEM files, served by rustls (ring, as the registry client uses).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("reading {what} from {}: {detail}", path.display())]
    Pem {
        /// Certificate or key.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the parser said.
        detail: String,
    },
    /// The certificate file holds no certificate.
    #[error("{} holds no certificate", .0.display())]
    NoCertificate(PathBuf),
    /// rustls refused the pair (say, the key does not match).
    #[error("the certificate and key do not make a TLS server")]
    Config(#[source] rustls::Error),
}

/// A TLS acceptor serving `cert` (PEM chain, leaf first) with `key`.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let pem = |what, path: &Path| {
        let path = path.to_owned();
        move |e: rustls::pki_types::pem::Error| TlsError::Pem {
            what,
            path,
            detail: e.to_string(),
        }
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(pem("certificates", cert))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem("certificates", cert))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert.to_owned()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(pem("the private key", key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
